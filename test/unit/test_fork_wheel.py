"""wheel: the patched sglang as a wheel, reproducible, refused on bad input, and
its plugin that names the running series and never raises."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import BASE_FILES, Project, build_wheel

LABEL = "0.0.1+xpu.s"
TAGS = "cp311-cp311-manylinux_2_34_x86_64"
PATCHED = {
    "sglang/srt/flags.py": b"VALUE = 2\nNAME = 'upstream'\n",
    "sglang/srt/other.py": b"def answer():\n    return 42\n",
    "sglang/srt/third.py": b"LIMIT = 20\n",
}


def build(project: Project, out: Path, *args: str) -> dict:
    result = project.run("--json", "wheel", "--out", str(out), *args)
    assert result.code == 0, result.err
    return json.loads(result.out)


def record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {info.filename: zf.read(info) for info in zf.infolist()}


def dist_info(path: Path) -> str:
    (name,) = {n.split("/")[0] for n in members(path) if ".dist-info/" in n}
    return name


def add_wheels_table(project: Project, table: str) -> None:
    toml = project.patches / "upstream.toml"
    toml.write_text(toml.read_text() + "\n" + table)


def test_built_twice_it_is_the_same_bytes_with_the_label_and_a_whole_record(
    three_patches: Project, tmp_path: Path
) -> None:
    first = build(three_patches, tmp_path / "one")
    second = build(three_patches, tmp_path / "two")
    path = Path(first["path"])
    assert path.read_bytes() == Path(second["path"]).read_bytes()
    assert path.name == f"sglang-{first['version']}-{TAGS}.whl"
    assert first["version"].startswith(LABEL) and first["state"] == "written"
    got = members(path)
    dist = dist_info(path)
    assert dist == f"sglang-{first['version']}.dist-info"
    meta = got[f"{dist}/METADATA"].decode()
    assert f"\nVersion: {first['version']}\n" in meta
    for name, data in PATCHED.items():
        assert got[name] == data
    assert got["sglang/srt/long.py"] == BASE_FILES["sglang/srt/long.py"].encode()
    # RECORD lists every other entry once, each with its hash and size.
    rows = list(csv.reader(io.StringIO(got[f"{dist}/RECORD"].decode())))
    assert [r[0] for r in rows] == list(got)  # in the zip's own order, RECORD last
    assert rows[-1] == [f"{dist}/RECORD", "", ""]
    for name, digest, size in rows[:-1]:
        assert (digest, int(size)) == (record_hash(got[name]), len(got[name])), name
    # Package files sorted, then the dist-info sorted; one date; fixed modes.
    names = list(got)[:-1]
    assert names == sorted(names, key=lambda n: (n.startswith(f"{dist}/"), n))
    with zipfile.ZipFile(path) as zf:
        infos = {i.filename: i for i in zf.infolist()}
    assert {i.date_time for i in infos.values()} == {(1980, 1, 1, 0, 0, 0)}
    assert infos["sglang/bin/tool.sh"].external_attr >> 16 == 0o100755
    assert infos["sglang/srt/flags.py"].external_attr >> 16 == 0o100644
    identity = json.loads(got[f"{dist}/xpu_series.json"])
    assert identity["series_sha256"] == first["series_sha256"]
    assert [p["name"] for p in identity["patches"]] == first["patches"]
    assert identity["source"]["sha256"] == three_patches.sha
    assert identity["files"] == {
        name: hashlib.sha256(data).hexdigest() for name, data in PATCHED.items()
    }
    entry_points = got[f"{dist}/entry_points.txt"].decode()
    assert "[sglang.srt.plugins]\nxpu_series = sglang_xpu_series:announce\n" in (
        entry_points
    )


def test_source_date_epoch_dates_every_entry(
    three_patches: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    default = build(three_patches, tmp_path / "default")
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")  # 2023-11-14 22:13:20
    dated = build(three_patches, tmp_path / "dated")
    assert dated["sha256"] != default["sha256"]
    with zipfile.ZipFile(dated["path"]) as zf:
        assert {i.date_time for i in zf.infolist()} == {(2023, 11, 14, 22, 13, 20)}


def test_a_wheel_whose_hash_is_not_the_pins_exits_4_and_writes_nothing(
    three_patches: Project, tmp_path: Path
) -> None:
    other = tmp_path / "other" / three_patches.wheel.name
    other.parent.mkdir()
    build_wheel(other, {**BASE_FILES, "sglang/srt/third.py": "LIMIT = 99\n"})
    out = tmp_path / "out"
    refused = three_patches.run("wheel", "--out", str(out), "--wheel", str(other))
    assert refused.code == 4, refused.err
    assert "sha256" in refused.err and three_patches.sha in refused.err
    assert not out.exists()
    # The cached copy changed on disk: the same refusal, and it is not used.
    three_patches.cached.write_bytes(other.read_bytes())
    refused = three_patches.run("wheel", "--out", str(out))
    assert refused.code == 4, refused.err
    assert not out.exists()


def test_a_release_the_series_does_not_serve_exits_4_and_writes_nothing(
    three_patches: Project, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    for release in ("0.0.2", "0.0.0"):
        refused = three_patches.run("wheel", "--out", str(out), "--upstream", release)
        assert refused.code == 4, refused.err
        assert f"serves sglang 0.0.1 to 0.0.1, not {release}" in refused.err
    assert not out.exists()


def test_a_python_tag_with_no_recorded_hash_exits_4_and_says_how_to_record_it(
    three_patches: Project, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    refused = three_patches.run("wheel", "--out", str(out), "--python-tag", "cp312")
    assert refused.code == 4, refused.err
    assert "records no sha256 for sglang-0.0.1-cp312-cp312-" in refused.err
    assert '[wheels."0.0.1"]' in refused.err and "--python-version 3.12" in refused.err
    assert not out.exists()


def test_another_wheel_of_the_same_name_is_refused_and_force_replaces_it(
    three_patches: Project, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    built = build(three_patches, out)
    path = Path(built["path"])
    good = path.read_bytes()
    assert build(three_patches, out)["state"] == "unchanged"
    path.write_bytes(good + b"\0")
    refused = three_patches.run("wheel", "--out", str(out))
    assert refused.code != 0 and "different wheel" in refused.err
    assert "--force" in refused.err
    assert path.read_bytes() == good + b"\0"
    assert sorted(p.name for p in out.iterdir()) == [path.name]  # no leftovers
    assert build(three_patches, out, "--force")["state"] == "replaced"
    assert path.read_bytes() == good


def cp312_wheel(folder: Path, files: dict[str, str]) -> tuple[Path, str]:
    """The release's wheel for another Python: its own extension module."""
    path = folder / "sglang-0.0.1-cp312-cp312-manylinux_2_34_x86_64.whl"
    folder.mkdir(exist_ok=True)
    sha = build_wheel(path, {**files, "sglang/_ext.cpython-312.so": "\x7fELF"})
    return path, sha


def test_another_python_tag_builds_from_that_wheel_when_its_hash_is_recorded(
    three_patches: Project, tmp_path: Path
) -> None:
    wheel, sha = cp312_wheel(tmp_path / "cp312", BASE_FILES)
    add_wheels_table(three_patches, f'[wheels."0.0.1"]\ncp312 = "{sha}"\n')
    built = build(
        three_patches, tmp_path / "out", "--python-tag", "cp312", "--wheel", str(wheel)
    )
    assert Path(built["path"]).name.endswith("-cp312-cp312-manylinux_2_34_x86_64.whl")
    got = members(Path(built["path"]))
    assert got["sglang/_ext.cpython-312.so"] == b"\x7fELF"
    for name, data in PATCHED.items():
        assert got[name] == data
    # --python names the interpreter instead: this one's tag (cp311 or cp312,
    # both recorded now).
    mine = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    asked = build(three_patches, tmp_path / "mine", "--python", sys.executable)
    assert asked["tag"] == mine and Path(asked["path"]).name.endswith(
        f"-{mine}-{mine}-manylinux_2_34_x86_64.whl"
    )


def test_a_wheel_of_another_tag_with_other_py_files_is_refused(
    three_patches: Project, tmp_path: Path
) -> None:
    files = {**BASE_FILES, "sglang/srt/other.py": "def answer():\n    return 7\n"}
    wheel, sha = cp312_wheel(tmp_path / "cp312", files)
    add_wheels_table(three_patches, f'[wheels."0.0.1"]\ncp312 = "{sha}"\n')
    out = tmp_path / "out"
    refused = three_patches.run(
        "wheel", "--out", str(out), "--python-tag", "cp312", "--wheel", str(wheel)
    )
    assert refused.code == 4, refused.err
    assert "sglang/srt/other.py" in refused.err and "flags.py" not in refused.err
    assert not out.exists()


def test_an_older_served_release_gets_the_series_as_it_applies_there(
    three_patches: Project, tmp_path: Path
) -> None:
    from test_rebase import newer

    moved = newer(tmp_path, other="# moved\ndef answer():\n    return 41\n")
    assert (
        three_patches.run("rebase", "--onto", "0.0.2", "--wheel", str(moved)).code == 0
    )
    toml = three_patches.patches / "upstream.toml"
    toml.write_text(
        toml.read_text().replace("[upstream]\n", '[upstream]\nserves-from = "0.0.1"\n')
    )
    out = tmp_path / "out"
    unrecorded = three_patches.run("wheel", "--out", str(out), "--upstream", "0.0.1")
    assert unrecorded.code == 4 and "records no sha256" in unrecorded.err
    add_wheels_table(
        three_patches, f'[wheels."0.0.1"]\ncp311 = "{three_patches.sha}"\n'
    )
    built = build(three_patches, out, "--upstream", "0.0.1")
    assert built["version"].startswith(LABEL) and built["release"] == "0.0.1"
    got = members(Path(built["path"]))
    assert got["sglang/srt/other.py"] == PATCHED["sglang/srt/other.py"]
    pinned = build(three_patches, out)
    assert pinned["version"].startswith("0.0.2+xpu.s")
    assert members(Path(pinned["path"]))["sglang/srt/other.py"] == (
        b"# moved\ndef answer():\n    return 42\n"
    )


# -- the plugin, as the wheel ships it ---------------------------------------------


def installed(three_patches: Project, tmp_path: Path) -> Path:
    """The fork wheel unpacked into a site folder, as pip lays it out."""
    built = build(three_patches, tmp_path / "out")
    site = tmp_path / "site"
    with zipfile.ZipFile(built["path"]) as zf:
        zf.extractall(site)
    return site


# How sglang runs a general plugin: every entry point of the group, called.
LOAD = """
import logging, sys
from importlib.metadata import entry_points
if sys.argv[1:]:  # a handler on stdout at this level, as sglang's imports leave
    level = getattr(logging, sys.argv[1])
    logging.basicConfig(stream=sys.stdout, level=level, format="%(message)s")
for ep in entry_points(group="sglang.srt.plugins"):
    ep.load()()
print("survived")
"""


def load_plugins(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # -S: no site-packages, so `sglang` is the one in `site` and nothing else.
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        [sys.executable, "-S", "-c", LOAD, *args],
        env=env, capture_output=True, text=True, timeout=60, cwd=site,
    )  # fmt: skip


def test_the_plugin_logs_one_line_naming_the_series(
    three_patches: Project, tmp_path: Path
) -> None:
    site = installed(three_patches, tmp_path)
    dist = next(site.glob("sglang-*.dist-info"))
    identity = json.loads((dist / "xpu_series.json").read_text())
    sha = identity["series_sha256"]
    proc = load_plugins(site)
    assert proc.returncode == 0 and proc.stdout == "survived\n", proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.endswith(
        f"sglang-xpu: series s{sha[:12]} (3 patches, series sha256 {sha}) on "
        f"sglang {identity['version']}"
    )
    assert line.startswith("[20")  # sglang's own format: the time first
    # Once logging shows INFO, the line goes through its handlers.
    proc = load_plugins(site, "INFO")
    assert proc.stderr == ""
    assert proc.stdout.splitlines()[0].startswith(f"sglang-xpu: series s{sha[:12]}")
    # Before sglang configures logging, its imports leave a handler at WARNING
    # (as the launcher's do): the line is written all the same.
    proc = load_plugins(site, "WARNING")
    assert proc.stdout == "survived\n" and proc.stderr.strip().endswith(line[-60:])


def test_the_plugin_warns_about_the_first_file_that_is_not_the_series(
    three_patches: Project, tmp_path: Path
) -> None:
    site = installed(three_patches, tmp_path)
    (site / "sglang/srt/third.py").write_text("LIMIT = 10\n")
    (site / "sglang/srt/other.py").write_text("def answer():\n    return 41\n")
    proc = load_plugins(site)
    assert proc.returncode == 0, proc.stderr
    line, warning = proc.stderr.splitlines()
    assert "sglang/srt/other.py differs from the series' file" in warning
    assert "third.py" not in warning and "sglang-xpu: series s" in line
    (site / "sglang/srt/flags.py").unlink()
    assert "sglang/srt/flags.py is missing" in load_plugins(site).stderr


@pytest.mark.parametrize(
    "record",
    [b"\0garbage", b"[1, 2]", b'{"files": [1], "patches": 3}', b'{"files": {"a": 1}}'],
)
def test_the_plugin_never_raises_on_garbage(
    three_patches: Project, tmp_path: Path, record: bytes
) -> None:
    site = installed(three_patches, tmp_path)
    dist = next(site.glob("sglang-*.dist-info"))
    (dist / "xpu_series.json").write_bytes(record)
    proc = load_plugins(site)
    assert proc.returncode == 0 and proc.stdout == "survived\n", proc.stderr
    assert "sglang-xpu:" in proc.stderr and "Traceback" not in proc.stderr


def test_the_plugin_never_raises_even_when_describing_fails(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from xpu_series.fork import plugin

    def broken(_site: Path) -> list[tuple[int, str]]:
        raise RecursionError("deep")

    monkeypatch.setattr(plugin, "describe", broken)
    plugin.announce()
    assert caplog.messages == [
        "sglang-xpu: cannot describe the series: RecursionError('deep')"
    ]


def test_a_python_that_cannot_run_is_a_usage_error(
    three_patches: Project, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    missing = three_patches.run("wheel", "--out", str(out), "--python", "/no/python")
    assert missing.code == 2 and "cannot run /no/python" in missing.err
    assert not out.exists()
