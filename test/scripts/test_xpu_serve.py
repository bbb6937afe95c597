"""scripts/xpu-serve --dry-run: the command it builds and what it refuses."""

from __future__ import annotations

import glob
import grp
import json
import os
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import SCRIPTS

ROOT = SCRIPTS.parent
PIN = tomllib.loads((ROOT / "patches/upstream.toml").read_text())["upstream"]
STOCK = f"lmsysorg/sglang:v{PIN['version']}-xpu"


@pytest.fixture
def fake_docker(tmp_path: Path) -> tuple[Path, Path]:
    """A docker CLI that lists one existing container and logs every call."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "docker-calls"
    script = bin_dir / "docker"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {calls}\n'
        'if [ "$1" = ps ]; then echo other-run; echo sglang-xpu; fi\n'
    )
    script.chmod(0o755)
    return bin_dir, calls


def serve(*args: str, path: str | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": path or "/nonexistent:/usr/bin:/bin", "HOME": "/home/u"}
    return subprocess.run(
        [sys.executable, str(SCRIPTS / "xpu-serve"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def command(proc: subprocess.CompletedProcess) -> list[str]:
    assert proc.returncode == 0, proc.stderr
    return shlex.split(proc.stdout.strip().splitlines()[0])


def env_of(cmd: list[str]) -> list[str]:
    return [cmd[i + 1] for i, word in enumerate(cmd) if word == "-e"]


def test_one_gpu(tmp_path: Path) -> None:
    cmd = command(
        serve("--model", "Qwen/Qwen3-0.6B", "--gpus", "1", "--render-gid", "993",
              "--dry-run")
    )  # fmt: skip
    assert cmd[:6] == ["docker", "run", "-d", "--name", "sglang-xpu", "--network"]
    assert "--rm" not in cmd
    assert cmd[cmd.index("--group-add") + 1] == "993"
    assert "ZE_AFFINITY_MASK=0" in env_of(cmd)
    assert not any(e.startswith("FI_TCP_IFACE") for e in env_of(cmd))
    tail = cmd[cmd.index(STOCK) :]
    assert tail[:4] == [STOCK, "python3", "-m",
                        "sglang.launch_server"]  # fmt: skip
    for flag, value in (
        ("--device", "xpu"),
        ("--tp", "1"),
        ("--attention-backend", "intel_xpu"),
        ("--page-size", "64"),
    ):
        assert tail[tail.index(flag) + 1] == value  # fmt: skip


def test_two_gpus_get_the_mask_and_loopback() -> None:
    cmd = command(
        serve("--model", "m", "--tp", "2", "--gpus", "2", "--render-gid", "5",
              "--name", "sglang-xpu-tp", "--dry-run", "--", "--mem-fraction-static",
              "0.8")
    )  # fmt: skip
    assert "ZE_AFFINITY_MASK=0,1" in env_of(cmd)
    assert "FI_TCP_IFACE=lo" in env_of(cmd)
    assert cmd[4] == "sglang-xpu-tp"
    assert cmd[-2:] == ["--mem-fraction-static", "0.8"]


def test_multi_node_tp_does_not_pin_loopback() -> None:
    cmd = command(
        serve("--model", "m", "--tp", "2", "--gpus", "2", "--render-gid", "5",
              "--nnodes", "2", "--dry-run")
    )  # fmt: skip
    assert not any(e.startswith("FI_TCP_IFACE") for e in env_of(cmd))


def test_tp_larger_than_the_gpus_is_refused() -> None:
    proc = serve("--model", "m", "--tp", "4", "--gpus", "2", "--render-gid", "5",
                 "--dry-run")  # fmt: skip
    assert proc.returncode == 2
    assert "--tp 4 needs 4 GPUs but 2 are available" in proc.stderr
    assert proc.stdout == ""


def test_gpu_count_is_discovered_from_xpu_smi(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "xpu-smi"
    smi.write_text(
        "#!/bin/sh\ncat <<'T'\n| Device ID | Device Information |\n"
        "| 0         | Device Name: Intel(R) Arc(TM) Pro B60 |\n"
        "| 1         | Device Name: Intel(R) Arc(TM) Pro B60 |\nT\n"
    )
    smi.chmod(0o755)
    path = f"{bin_dir}:/usr/bin:/bin"
    ok = serve("--model", "m", "--tp", "2", "--render-gid", "5", "--dry-run", path=path)
    assert "ZE_AFFINITY_MASK=0,1" in env_of(command(ok))
    refused = serve("--model", "m", "--tp", "3", "--render-gid", "5", "--dry-run",
                    path=path)  # fmt: skip
    assert refused.returncode == 2 and "but 2 are available" in refused.stderr


def test_existing_container_name_is_refused_and_kept(fake_docker) -> None:
    bin_dir, calls = fake_docker
    proc = serve("--model", "m", "--gpus", "1", "--render-gid", "5",
                 path=f"{bin_dir}:/usr/bin:/bin")  # fmt: skip
    assert proc.returncode == 2
    assert "a container named sglang-xpu already exists" in proc.stderr
    assert "never" in proc.stderr and "removed" in proc.stderr
    # Only the listing ran: nothing was started, stopped or removed.
    assert calls.read_text().splitlines() == ["ps -a --format {{.Names}}"]


def test_free_name_runs_the_built_command(fake_docker) -> None:
    bin_dir, calls = fake_docker
    proc = serve("--model", "m", "--gpus", "1", "--render-gid", "5",
                 "--name", "sglang-xpu-2", path=f"{bin_dir}:/usr/bin:/bin")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    run_call = calls.read_text().splitlines()[-1]
    assert run_call.startswith("run -d --name sglang-xpu-2 ")
    assert "next: scripts/xpu-verify --container sglang-xpu-2" in proc.stdout


def test_non_literal_name_is_refused() -> None:
    proc = serve("--model", "m", "--gpus", "1", "--render-gid", "5",
                 "--name", "$NAME", "--dry-run")  # fmt: skip
    assert proc.returncode == 2 and "not a literal docker name" in proc.stderr


def describe(version: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    proc = subprocess.run(
        [sys.executable, "-m", "xpu_series", "-C", str(ROOT), "--json", "overlay",
         "--describe", "--upstream", version],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    return json.loads(proc.stdout)


@pytest.mark.parametrize("version", [PIN["version"], PIN["serves-from"]])
def test_fork_dry_run_prints_the_build_and_the_run_of_that_image(version: str) -> None:
    proc = serve("--model", "m", "--gpus", "1", "--render-gid", "5", "--fork",
                 "--sglang-version", version, "--dry-run")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    build, run = (shlex.split(line) for line in proc.stdout.strip().splitlines())
    fork = describe(version)
    tag = f"sglang-xpu:v{version}-xpu-s{fork['series_sha256'][:12]}"
    assert build[:4] == ["docker", "build", "-f", str(ROOT / "docker/Dockerfile")]
    args = [build[i + 1] for i, word in enumerate(build) if word == "--build-arg"]
    assert f"SGLANG_VERSION={version}" in args
    assert f"SERIES_SHA256={fork['series_sha256']}" in args
    assert f"SERIES_VERSION={fork['version']}" in args
    assert build[-3:] == ["-t", tag, str(ROOT)]
    assert run[:2] == ["docker", "run"] and tag in run
    assert run[run.index(tag) + 1 : run.index(tag) + 4] == [
        "python3",
        "-m",
        "sglang.launch_server",
    ]


def test_fork_of_a_release_the_series_does_not_serve_is_refused() -> None:
    proc = serve("--model", "m", "--gpus", "1", "--render-gid", "5", "--fork",
                 "--sglang-version", "0.5.1", "--dry-run")  # fmt: skip
    assert proc.returncode == 2
    assert "the series serves sglang" in proc.stderr and "hint:" in proc.stderr
    both = serve("--model", "m", "--gpus", "1", "--render-gid", "5", "--fork",
                 "--image", "x", "--dry-run")  # fmt: skip
    assert both.returncode == 2 and "drop one of them" in both.stderr


@pytest.mark.parametrize("present", [True, False])
def test_fork_builds_only_when_its_tag_is_missing(
    tmp_path: Path, present: bool
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    (bin_dir / "docker").write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {calls}\n'
        f'if [ "$1 $2" = "image inspect" ]; then exit {0 if present else 1}; fi\n'
    )
    (bin_dir / "docker").chmod(0o755)
    proc = serve("--model", "m", "--gpus", "1", "--render-gid", "5", "--fork",
                 path=f"{bin_dir}:/usr/bin:/bin")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    verbs = [line.split()[0] for line in calls.read_text().splitlines()]
    assert verbs == (
        ["ps", "image", "run"] if present else ["ps", "image", "build", "run"]
    )


def _has_intel_gpu() -> bool:
    try:
        grp.getgrnam("render")
        return True
    except KeyError:
        return bool(glob.glob("/dev/dri/renderD*"))


@pytest.mark.skipif(
    _has_intel_gpu(),
    reason="this machine has a render group or /dev/dri render nodes: "
    "xpu-serve discovers them, so nothing is a placeholder",
)
def test_dry_run_without_a_gpu_prints_placeholders_and_says_so(tmp_path: Path) -> None:
    proc = serve("--model", "m", "--fork", "--tp", "2", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    notes = [line for line in lines if line.startswith("#")]
    build, run = (line for line in lines if not line.startswith("#"))
    assert len(notes) == 2 and all(n.startswith("# placeholder: ") for n in notes)
    assert "no Intel GPU found here: --tp 2" in notes[0]
    assert "render group's GID is unknown here" in notes[1]
    # The placeholders change nothing else: the build is the one a real host
    # gets, and so is the run but for the GID.
    real = serve("--model", "m", "--fork", "--tp", "2", "--gpus", "2",
                 "--render-gid", "4242", "--dry-run")  # fmt: skip
    real_build, real_run = real.stdout.strip().splitlines()
    assert build == real_build
    # On the serving host the placeholder is the render GID: run the printed
    # line there (a docker that prints its arguments, a stat that knows 4242).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    (bin_dir / "stat").write_text(
        '#!/bin/sh\n[ "$*" = "-c %g /dev/dri/renderD128" ] && echo 4242\n'
    )
    for tool in ("docker", "stat"):
        (bin_dir / tool).chmod(0o755)
    ran = subprocess.run(
        ["bash", "-c", run], capture_output=True, text=True,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": "/home/u"},
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == shlex.split(real_run)[1:]


@pytest.mark.skipif(_has_intel_gpu(), reason="this machine has an Intel GPU")
def test_without_a_gpu_only_the_dry_run_uses_placeholders() -> None:
    refused = serve("--model", "m")
    assert refused.returncode == 2 and refused.stdout == ""
    assert "no Intel GPU found" in refused.stderr
    assert "--dry-run prints the commands anyway" in refused.stderr
    # A GPU count given, the render GID alone is a placeholder.
    proc = serve("--model", "m", "--gpus", "2", "--dry-run")
    notes = [ln for ln in proc.stdout.splitlines() if ln.startswith("# placeholder")]
    assert len(notes) == 1 and "render group's GID" in notes[0]
