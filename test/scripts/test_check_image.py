"""scripts/check_image.py: the fork image's expected labels, the build it runs, its
verdicts, the rootfs cache, and what it says without buildah (no image is built
here: the CI step `image` builds them)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import SCRIPTS, load_script

ROOT = SCRIPTS.parent
PIN = tomllib.loads((ROOT / "patches/upstream.toml").read_text())["upstream"]
RELEASES = [PIN["version"], PIN["serves-from"]]


@pytest.fixture(scope="module")
def ci():
    return load_script("check_image.py")


def dockerfile_labels(build_args: dict[str, str]) -> dict[str, str]:
    """The LABEL instruction of docker/Dockerfile with the build's arguments put
    in, as a builder expands it."""
    text = (ROOT / "docker" / "Dockerfile").read_text().replace("\\\n", " ")
    (line,) = [ln for ln in text.splitlines() if ln.startswith("LABEL ")]
    labels = dict(word.split("=", 1) for word in shlex.split(line[len("LABEL ") :]))
    return {
        key: re.sub(r"\$\{(\w+)\}", lambda m: build_args[m.group(1)], value)
        for key, value in labels.items()
    }


@pytest.mark.parametrize("release", RELEASES)
def test_the_labels_checked_are_the_ones_the_build_writes(ci, release: str) -> None:
    _tag, docker = ci.SERVE.fork_build(release)
    build_args = dict(
        docker[i + 1].split("=", 1) for i, w in enumerate(docker) if w == "--build-arg"
    )
    fork = ci.describe(release)
    expected = ci.expected_labels(release, fork, ci.git_head())
    written = dockerfile_labels(build_args)
    assert {key: written[key] for key in expected} == expected
    # ... and they say what the overlay installs: the release with the series'
    # local label, and the series' sha256.
    assert expected["org.opencontainers.image.version"] == (
        f"{release}+xpu.s{fork['series_sha256'][:12]}"
    )
    assert build_args["REVISION"] == ci.git_head()


def test_the_build_is_xpu_serves_with_buildah(ci) -> None:
    tag, docker = ci.SERVE.fork_build(PIN["version"])
    args = ci.bud_args(docker, ["one:1", "two:2"])
    assert args[:4] == ["bud", "--isolation", "chroot", "--pull=never"]
    assert args[-1] == docker[-1] == str(ROOT)
    # Every argument of docker build but its tag, in its order.
    assert [w for w in args[4:] if w not in ("-t", "one:1", "two:2")] == [
        w for w in docker[2:] if w != "-t" and w != tag
    ]
    assert args[args.index("-t") + 1] == "one:1" and "two:2" in args
    broken = ci.bud_args(docker, ["x:1"], from_image="bad:1")
    assert broken[broken.index("--from") + 1] == "bad:1"
    with pytest.raises(ValueError, match="not a docker build"):
        ci.bud_args(["docker", "run", "x"], [])


def good_image(ci, release: str) -> tuple[dict, dict, dict]:
    """What a correct fork image of `release` shows: expected labels, its config,
    and what the probe reads inside it."""
    fork = ci.describe(release)
    expected = ci.expected_labels(release, fork, ci.git_head())
    site = "/opt/venv/lib/python3.11/site-packages"
    config = {
        "Cmd": ["bash"],
        "Env": [f"PATH={ci.PATH}", "VIRTUAL_ENV=/opt/venv"],
        "Labels": dict(expected, **{"org.opencontainers.image.title": "sglang-xpu"}),
    }
    status = {
        "site": site,
        "provenance": {"series_sha256": fork["series_sha256"]},
        "files": [{"path": "sglang/a.py", "state": "intact"}],
    }
    facts = {
        "uid": 0,
        "prefix": "/opt/venv",
        "python": "3.11",
        "sglang": f"{site}/sglang/__init__.py",
        "version": fork["version"],
        "record": True,
        "direct_url": '{"archive_info": {}, "url": "file:///tmp/x.whl"}',
        "launcher": ci.LAUNCHER,
        "tool": {"code": 0, "out": "0.1.0\n", "err": ""},
        "status": {"code": 0, "out": json.dumps(status), "err": ""},
    }
    return expected, config, facts


def _status_with(facts: dict, **changes) -> None:
    status = json.loads(facts["status"]["out"])
    status.update(changes)
    facts["status"]["out"] = json.dumps(status)


FAULTS = {
    "label org.opencontainers.image.revision": lambda c, f: c["Labels"].update(
        {"org.opencontainers.image.revision": "0" * 40}
    ),
    "entrypoint": lambda c, f: c.update(Entrypoint=["/bin/sh", "-c"]),
    "does not start with /opt/venv/bin": lambda c, f: c.update(
        Env=["PATH=/usr/bin:/opt/venv/bin"]
    ),
    "not root": lambda c, f: f.update(uid=1000),
    "imports sglang from": lambda c, f: f.update(sglang="/usr/lib/sglang/x.py"),
    "non-editable": lambda c, f: f.update(
        direct_url='{"dir_info": {"editable": true}}'
    ),
    "(the series' label)": lambda c, f: f.update(version=PIN["version"]),
    "overlay --status exited 1": lambda c, f: f["status"].update(code=1, err="x"),
    "not every file intact": lambda c, f: _status_with(
        f, files=[{"path": "sglang/a.py", "state": "changed"}]
    ),
    "the overlay installed is of series": lambda c, f: _status_with(
        f, provenance={"series_sha256": "f" * 64}
    ),
    "the xpu-series on PATH is missing": lambda c, f: f.update(launcher=""),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_judge_names_each_way_an_image_falls_short(ci, fault: str) -> None:
    expected, config, facts = good_image(ci, PIN["version"])
    assert ci.judge(expected, config, facts) == []
    FAULTS[fault](config, facts)
    problems = ci.judge(expected, config, facts)
    assert len(problems) == 1 and fault in problems[0], problems


def test_a_wheel_image_must_carry_no_overlay(ci) -> None:
    expected, config, facts = good_image(ci, PIN["version"])
    # An overlay found in a FORK_INSTALL=wheel image is a fault there...
    problems = ci.judge(expected, config, facts, "wheel")
    assert len(problems) == 1 and "FORK_INSTALL=wheel writes none" in problems[0]
    # ... and overlay --status with no provenance is what a wheel image shows.
    _status_with(facts, provenance=None, files=[])
    assert ci.judge(expected, config, facts, "wheel") == []
    assert any("not every file intact" in p for p in ci.judge(expected, config, facts))


def plugin_facts(sha: str, said: str, found: str = "1", code: int = 0) -> dict:
    return {
        "series_record": json.dumps({"series_sha256": sha}),
        "plugin": {"code": code, "out": f"{found}\n", "err": said},
    }


def test_judge_plugin_wants_one_line_naming_the_series(ci) -> None:
    expected, _config, _facts = good_image(ci, PIN["version"])
    sha = expected["io.sglang-xpu.series.sha256"]
    line = f"[t] sglang-xpu: series s{sha[:12]} (20 patches) on sglang x\n"
    assert ci.judge_plugin(expected, plugin_facts(sha, line)) == []
    faults = {
        "names series": plugin_facts("0" * 64, line),
        ": 0 found": plugin_facts(sha, line, found="0"),
        "exit 1": plugin_facts(sha, line, code=1),
        "not one line": plugin_facts(sha, line + line.replace("series", "warning")),
        "naming series": plugin_facts(sha, line.replace(sha[:12], "0" * 12)),
    }
    for words, facts in faults.items():
        problems = ci.judge_plugin(expected, facts)
        assert len(problems) == 1 and words in problems[0], (words, problems)


def test_the_wheel_mode_build_reads_the_wheels_folder(ci) -> None:
    # The build mounts docker/wheels; it is in the context and in the key.
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert "source=docker/wheels" in dockerfile and "--wheels" in dockerfile
    assert "!docker/wheels" in (ROOT / ".dockerignore").read_text().splitlines()
    assert "docker/wheels" in ci.CONTEXT and ci.WHEELS == ROOT / "docker" / "wheels"


def test_tree_digest_follows_content_not_bytecode(ci, tmp_path: Path) -> None:
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    digest = ci.tree_digest(tmp_path, ["pkg", "Dockerfile"])
    (tmp_path / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    assert ci.tree_digest(tmp_path, ["pkg", "Dockerfile"]) == digest
    (tmp_path / "pkg" / "a.py").write_text("x = 2\n")
    assert ci.tree_digest(tmp_path, ["pkg", "Dockerfile"]) != digest


FAKE_MMDEBSTRAP = """#!/bin/sh
if [ "$1" = --version ]; then echo "mmdebstrap 0.0-fake"; exit 0; fi
echo "$*" >> {calls}
echo "I: downloading packages with apt..." >&2
echo "I: extracting archives..." >&2
{body}
"""


def fake_mmdebstrap(tmp_path: Path, body: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "calls"
    script = bin_dir / "mmdebstrap"
    script.write_text(FAKE_MMDEBSTRAP.format(calls=calls, body=body))
    script.chmod(0o755)
    return calls


def test_the_rootfs_is_made_once_per_recipe_with_progress(
    ci, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = fake_mmdebstrap(
        tmp_path, 'for t in "$@"; do :; done\nprintf "rootfs of %s" "$*" > "$t"'
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    said: list[str] = []
    folder = tmp_path / "rootfs"
    spec = ci.RootfsSpec("bookworm", ("python3", "python3-venv"))
    made = ci.make_rootfs(spec, folder, said.append)
    assert made.read_text().startswith("rootfs of --variant=essential --format=tar")
    assert "--include=python3,python3-venv" in made.read_text()
    # Its progress, line by line, with the time taken so far.
    assert any(re.match(r"rootfs: +\d+\.\ds I: extracting archives", s) for s in said)
    assert list(folder.glob(".*")) == []  # no partial file left
    said.clear()
    assert ci.make_rootfs(spec, folder, said.append) == made
    assert len(calls.read_text().splitlines()) == 1
    assert said[0].startswith("rootfs: cached")
    # Another recipe is another tarball; the old one is never read again.
    other = ci.make_rootfs(ci.RootfsSpec("bookworm", ("python3",)), folder, said.append)
    assert other != made and not made.exists() and other.is_file()


def test_a_quiet_mmdebstrap_still_shows_progress(
    ci, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_mmdebstrap(
        tmp_path, 'sleep 1\nfor t in "$@"; do :; done\necho I: done >&2\n: > "$t"'
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setattr(sys.modules["image_build"], "HEARTBEAT_S", 0.2)
    said: list[str] = []
    ci.make_rootfs(ci.RootfsSpec("bookworm", ("python3",)), tmp_path, said.append)
    quiet = said.index(next(s for s in said if s.endswith("I: done")))
    beats = [s for s in said[:quiet] if "... I: extracting archives..." in s]
    assert len(beats) >= 2, said


@pytest.mark.parametrize("unreachable", [True, False])
def test_a_failed_rootfs_leaves_nothing_and_says_why(
    ci, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unreachable: bool
) -> None:
    why = "E: Failed to fetch the archive" if unreachable else "E: dpkg broke"
    fake_mmdebstrap(tmp_path, f'echo "{why}" >&2\nexit 1')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    error = ci.Unreachable if unreachable else ci.BuildFailed
    with pytest.raises(error) as exc:
        ci.make_rootfs(ci.RootfsSpec("bookworm", ("python3",)), tmp_path / "r", print)
    assert ("cannot be reached" if unreachable else "E: dpkg broke") in str(exc.value)
    assert list((tmp_path / "r").iterdir()) == []


def run_script(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPTS / "check_image.py")],
        capture_output=True,
        text=True,
        env={"HOME": os.environ.get("HOME", "/root"), **env},
        timeout=120,
    )


def test_without_buildah_it_says_so_and_skips(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    proc = run_script({"PATH": str(tmp_path / "bin")})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "skipped: buildah and mmdebstrap not installed" in proc.stdout
    assert "hint: apt-get install buildah mmdebstrap" in proc.stdout


def test_not_as_root_it_says_so_and_skips(
    ci, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for tool in ("buildah", "mmdebstrap"):
        (tmp_path / tool).write_text("#!/bin/sh\n")
        (tmp_path / tool).chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CI", "true")
    monkeypatch.setattr(ci.os, "geteuid", lambda: 1000)
    why = ci.tools_ready(say=print)
    assert why.startswith("skipped: buildah builds the fork image as root only")
    assert "hint: run 'sudo scripts/test image'" in why


APT_GET = """#!/bin/sh
echo "$*" >> {calls}
{body}
"""


def fake_apt(tmp_path: Path, body: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "apt-calls"
    (bin_dir / "apt-get").write_text(APT_GET.format(calls=calls, body=body))
    (bin_dir / "apt-get").chmod(0o755)
    return calls


needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="CI installs buildah with apt-get as root only"
)


@needs_root
def test_ci_as_root_installs_buildah_and_mmdebstrap(
    ci, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An apt-get that installs what it is asked for (as stubs), and says so.
    calls = fake_apt(
        tmp_path,
        'if [ "$1" = install ]; then for p in "$@"; do case "$p" in -*|install) ;;'
        f' *) printf "#!/bin/sh\\n" > {tmp_path}/bin/$p; /bin/chmod 755 '
        f"{tmp_path}/bin/$p;; esac; done; fi",
    )
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setenv("CI", "true")
    said: list[str] = []
    assert ci.tools_ready(say=said.append) == ""
    assert calls.read_text().splitlines() == [
        "update -q",
        "install -y -q buildah mmdebstrap",
    ]
    assert [line for line in said if "done in" not in line] == [
        "installing: apt-get update -q",
        "installing: apt-get install -y -q buildah mmdebstrap",
    ]
    assert len(said) == 4 and re.match(r"installing: done in \d+\.\ds", said[1])


@needs_root
def test_ci_fails_when_apt_get_does_not_give_buildah(tmp_path: Path) -> None:
    fake_apt(tmp_path, "exit 0")
    proc = run_script({"PATH": str(tmp_path / "bin"), "CI": "true"})
    assert proc.returncode == 1
    assert "buildah, mmdebstrap is still not on PATH" in proc.stdout
    assert "hint:" in proc.stdout


@needs_root
def test_ci_without_the_debian_archive_says_so_and_skips(tmp_path: Path) -> None:
    fake_apt(
        tmp_path, "echo \"Temporary failure resolving 'the-mirror'\" >&2; exit 100"
    )
    proc = run_script({"PATH": str(tmp_path / "bin"), "CI": "true"})
    assert proc.returncode == 0, proc.stdout
    assert "skipped: apt-get update -q: the Debian archive cannot be reached" in (
        proc.stdout
    )


@pytest.mark.skipif(
    shutil.which("buildah") is None or os.geteuid() != 0,
    reason="needs buildah, as root (apt-get install buildah)",
)
def test_buildah_reads_back_what_it_stored(ci, tmp_path: Path) -> None:
    b = ci.Buildah(tmp_path / "images")
    assert b.image_id("localhost/nothing:here") is None
    for n in (1, 2, 3):
        ctr = b.run("from", "--quiet", "scratch").stdout.strip()
        b.run("config", "--label", f"io.example.n={n}", "--cmd", '["bash"]', ctr)
        b.run("commit", "--quiet", "--rm", ctr, f"localhost/test/img:a-{n}")
    b.run("tag", "localhost/test/img:a-1", "localhost/test/served:v1")
    b.run("tag", "localhost/test/img:a-3", "localhost/test/img:b-3")
    config = b.config("localhost/test/img:a-1")
    assert config["Labels"]["io.example.n"] == "1" and config["Cmd"] == ["bash"]
    assert sorted(b.images("localhost/test/img")) == [
        "localhost/test/img:a-1",
        "localhost/test/img:a-2",
        "localhost/test/img:a-3",
        "localhost/test/img:b-3",
    ]
    # An older a- image goes with its other names; another prefix's stays.
    run = ci.Run.__new__(ci.Run)
    run.buildah = b
    run.prune("localhost/test/img", "a-", "localhost/test/img:a-3")
    assert sorted(b.images("localhost/test/img")) == [
        "localhost/test/img:a-3",
        "localhost/test/img:b-3",
    ]
    assert b.image_id("localhost/test/served:v1") is None


def test_the_storage_driver_is_chosen_by_a_probe_or_the_environment(
    ci, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build = sys.modules[ci.Buildah.__module__]
    monkeypatch.setenv(build.DRIVER_ENV, "vfs")
    b = ci.Buildah(tmp_path / "images")
    # vfs keeps the store it always had: an existing one stays valid.
    assert b.driver == "vfs" and str(tmp_path / "images" / "storage") in b.base
    monkeypatch.setenv(build.DRIVER_ENV, "btrfs")
    with pytest.raises(build.BuildFailed, match="btrfs: not a storage driver"):
        ci.Buildah(tmp_path / "images")
    monkeypatch.delenv(build.DRIVER_ENV)
    # No buildah at all: vfs, and the probe leaves nothing behind.
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert build.storage_driver(tmp_path / "images") == "vfs"
    assert not (tmp_path / "images" / "probe").exists()


@pytest.mark.skipif(
    shutil.which("buildah") is None or os.geteuid() != 0,
    reason="needs buildah, as root (apt-get install buildah)",
)
def test_the_probe_finds_overlay_where_the_kernel_mounts_it(ci, tmp_path: Path) -> None:
    build = sys.modules[ci.Buildah.__module__]
    probe = tmp_path / "o"
    (probe / "l").mkdir(parents=True)
    for name in ("u", "w", "m"):
        (probe / name).mkdir()
    opts = f"lowerdir={probe / 'l'},upperdir={probe / 'u'},workdir={probe / 'w'}"
    mounted = subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o", opts, str(probe / "m")],
        capture_output=True,
    )
    subprocess.run(["umount", str(probe / "m")], capture_output=True)
    expected = "overlay" if mounted.returncode == 0 else "vfs"
    assert build.storage_driver(tmp_path / "images") == expected
    assert not (tmp_path / "images" / "probe").exists()
