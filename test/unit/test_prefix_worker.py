"""The prefix worker (one interpreter per lane, a fork per run) dying: killed during
a run or while it waits for the next, its runs still finish, on a new worker, with
the outcomes they would have had, and no fork of it outlives it."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from conftest import Project, git

from xpu_series.git import Git
from xpu_series.project import Project as XpuProject
from xpu_series.proofs.proof import PrefixRunner, Run


def _children(name: str) -> list[int]:
    """This process's children whose command line names `name` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == os.getpid() and name.encode() in cmdline:
            found.append(int(entry.name))
    return found


def _gone(pid: int) -> bool:
    """Exited (a zombie not yet reaped counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _wait_gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.05)
    return False


def _value_patch(project: Project, body: str) -> str:
    test = project.root / "test" / "test_value.py"
    test.parent.mkdir(exist_ok=True)
    test.write_text(body)
    project.add_patch(
        "python/sglang/srt/flags.py",
        "VALUE = 2\nNAME = 'upstream'\n",
        "[XPU] Raise VALUE",
        Tests="test/test_value.py",
    )
    return "test/test_value.py"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_a_worker_killed_during_a_run_runs_it_again(
    project: Project, tmp_path: Path
) -> None:
    # The first run to get here kills its worker (the fork's parent, as the
    # kernel's OOM killer would) and goes on as a run still busy would.
    mark = tmp_path / "killed"
    _value_patch(
        project,
        "import os, signal, time\nfrom pathlib import Path\n"
        "from sglang.srt.flags import VALUE\n\n"
        f"MARK = Path({str(mark)!r})\n\n"
        "def test_value():\n"
        "    if not MARK.exists():\n"
        "        MARK.write_text(f'{os.getppid()} {os.getpid()}')\n"
        "        os.kill(os.getppid(), signal.SIGKILL)\n"
        "        time.sleep(60)\n"
        "    assert VALUE == 2\n",
    )
    result = project.run("verify", "-j", "1", "--json")
    worker, fork = (int(pid) for pid in mark.read_text().split())
    data = json.loads(result.out)
    assert result.code == 0, result.out + result.err
    (proof,) = data["patches"]
    assert proof["verdict"] == "proven"
    assert proof["without"] == {"passed": 0, "failed": 1, "skipped": 0, "errors": 0}
    assert proof["with"] == {"passed": 1, "failed": 0, "skipped": 0, "errors": 0}
    assert "the test worker died" in result.err and "new worker" in result.err
    assert _gone(worker)
    # The run the dead worker had started did not go on alone.
    assert _gone(fork), "a fork outlived its worker"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_a_worker_killed_between_runs_is_replaced(
    project: Project, tmp_path: Path
) -> None:
    test = _value_patch(
        project,
        "from sglang.srt.flags import VALUE\n\ndef test_value():\n"
        "    assert VALUE == 2\n",
    )
    tree = Git(project.tree)
    prefixes = [git(project.tree, "rev-parse", ref) for ref in ("upstream", "HEAD")]
    killed: list[int] = []
    heard: list[str] = []

    def kill_the_worker(line: str) -> None:
        """After a run is told, its worker waits for the next: kill it then."""
        heard.append(line)
        if killed or not line.startswith("prefix-"):
            return
        (worker,) = _children("xpu_series.proofs.prefix_worker")
        os.kill(worker, signal.SIGKILL)
        assert _wait_gone(worker)
        killed.append(worker)

    runner = PrefixRunner(
        XpuProject(project.root), tree, tmp_path / "worktrees", jobs=1,
        fresh=True, say=kill_the_worker,
    )  # fmt: skip
    runs = {f"prefix-{k}": Run(c, [test]) for k, c in enumerate(prefixes)}
    results = runner.run(runs)
    assert killed, "the worker was never killed: the test proved nothing"
    key = f"{test}::test_value"
    assert results == {"prefix-0": {key: "failed"}, "prefix-1": {key: "passed"}}
    assert "new worker" in " ".join(heard)
    assert not _children("xpu_series.proofs.prefix_worker"), "a worker was left running"


def test_a_fork_can_register_the_metrics_its_worker_imported_again() -> None:
    prometheus = pytest.importorskip("prometheus_client", reason="no prometheus_client")
    from xpu_series.proofs.prefix_worker import fresh_metrics

    prometheus.Counter("xpu_series_probe_total", "registered by the worker")
    with pytest.raises(ValueError):  # what a fork's fresh import of sglang hit
        prometheus.Counter("xpu_series_probe_total", "registered again")
    fresh_metrics()
    prometheus.Counter("xpu_series_probe_total", "registered by the fork")
    fresh_metrics()
