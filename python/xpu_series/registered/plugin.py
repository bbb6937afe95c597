"""A pytest plugin that runs the registered tests against their record
(`-p xpu_series.registered.plugin --registered-record=FILE`): the files
the record stands for are not collected, a re-run that disagrees with it fails
the session, and `--registered-write` runs every file and writes the record."""

from __future__ import annotations

import fnmatch
import importlib.util
from pathlib import Path
from typing import Any

import pytest

from xpu_series.errors import XpuSeriesError

# A later report never hides an earlier failure, ranked as verify's runs rank it.
from xpu_series.proofs.pytest_outcomes import _RANK
from xpu_series.proofs.record import in_ci, prove_all_asked
from xpu_series.registered import record


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("xpu-series registered record")
    group.addoption(
        "--registered-record",
        metavar="FILE",
        help="run against this record: the files it stands for are not collected",
    )
    group.addoption(
        "--registered-write",
        action="store_true",
        help="run every file and, if all pass, write the record",
    )


class _Run:
    """The plan of one session and what its tests did."""

    def __init__(self, config: pytest.Config, path: Path, write: bool) -> None:
        self.root = Path(config.rootpath).resolve()
        self.path = path
        self.write = write
        try:
            self.records = record.load(path)
        except XpuSeriesError:
            if not write:
                raise
            self.records = {}  # damaged: what this run writes replaces it
        self.tree = record.tree_state(_sglang_tree())
        files = _test_files(config, self.root)
        self.plan = record.plan(
            self.root,
            files,
            self.tree,
            self.records,
            everything=write or prove_all_asked(),
        )
        self.skip = {(self.root / f).resolve() for f in self.plan.trusted}
        self.outcomes: dict[str, dict[str, str]] = {}
        self.seconds: dict[str, float] = {}
        self.lines: list[str] = []
        self.failed = False
        # What the session runs, when it is not every test of the files
        # (-k, -m, a test named, --collect-only): then only those are compared,
        # and nothing is recorded.
        self.selected: set[str] | None = None
        self.collect_only = bool(config.getoption("collectonly"))
        self.partial = self.collect_only or any("::" in a for a in config.args)

    def note(self, nodeid: str, outcome: str, seconds: float) -> None:
        name = nodeid.split("::")[0]
        seen = self.outcomes.setdefault(name, {})
        if _RANK[outcome] >= _RANK.get(seen.get(nodeid, "passed"), 0):
            seen[nodeid] = outcome
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def finish(self, exitstatus: int) -> None:
        if self.collect_only:
            if self.write:
                self._save(exitstatus)  # says why it records nothing
            return
        ran = set(self.plan.run) | set(self.plan.sampled)
        for name in sorted(ran):
            kept = self.records.get(name)
            if kept is None or name in self.plan.stale:
                continue
            if self.partial:
                wanted = self.selected or set()
                kept = record.FileRecord(
                    kept.inputs,
                    {n: o for n, o in kept.outcomes.items() if n in wanted},
                    kept.seconds,
                )
            why = record.disagreement(kept, self.outcomes.get(name, {}))
            if why and not self.write:
                self.lines.append(
                    f"{name}: the re-run disagrees with its record: {why}"
                )
                self.failed = True
        if self.write:
            self._save(exitstatus)
        elif self.plan.stale and in_ci():
            self.lines.append(
                f"the record is stale for {'; '.join(self.plan.stale_files())} "
                f"(every such file ran); hint: {record.HINT}"
            )
            self.failed = True

    def _save(self, exitstatus: int) -> None:
        if exitstatus != 0:
            self.lines.append("not recorded: the run did not pass")
            return
        if self.partial:
            self.lines.append(
                "not recorded: not every test ran (-k, -m, a test named, or "
                "--collect-only)"
            )
            return
        if not self.tree.startswith("tree "):
            self.lines.append(f"not recorded: {self.tree}")
            return
        now_tree = record.tree_state(_sglang_tree())
        if now_tree != self.tree:
            self.lines.append(
                f"not recorded: the tree changed while it ran ({now_tree})"
            )
            return
        kept = {n: r for n, r in self.records.items() if (self.root / n).is_file()}
        moved = []
        shared = record.shared_inputs(self.root, self.tree)
        for name, inputs in self.plan.inputs.items():
            now = record.file_inputs(self.root, name, self.tree, shared)
            if now != inputs:
                moved.append(name)  # edited while it ran: not what ran
                continue
            kept[name] = record.FileRecord(
                inputs, self.outcomes.get(name, {}), self.seconds.get(name, 0.0)
            )
        record.save(self.path, kept)
        self.lines.append(
            f"recorded {len(self.plan.inputs) - len(moved)} files in {self.path}"
            + (f"; not {', '.join(moved)} (changed while it ran)" if moved else "")
        )


def _sglang_tree() -> Path | None:
    """The folder of the sglang the tests will import, without importing it."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.origin:
        return None
    return Path(spec.origin).resolve().parent


def _test_files(config: pytest.Config, root: Path) -> list[str]:
    """The test files the session's arguments name, relative to `root`."""
    patterns = config.getini("python_files")
    found: set[str] = set()
    for arg in config.args:
        path = (Path(config.invocation_params.dir) / arg.split("::")[0]).resolve()
        candidates = path.rglob("*.py") if path.is_dir() else [path]
        for file in candidates:
            if "__pycache__" in file.parts or not file.is_file():
                continue
            if any(fnmatch.fnmatch(file.name, p) for p in patterns):
                try:
                    found.add(str(file.relative_to(root)))
                except ValueError:
                    continue  # outside the checkout: not the record's to judge
    return sorted(found)


_KEY = pytest.StashKey[_Run]()


def pytest_configure(config: pytest.Config) -> None:
    option = config.getoption("--registered-record", default=None)
    if not option:
        return
    path = Path(config.invocation_params.dir) / option
    try:
        config.stash[_KEY] = _Run(config, path, config.getoption("--registered-write"))
    except XpuSeriesError as exc:
        raise pytest.UsageError(
            f"{exc.message}" + (f" (hint: {exc.hint})" if exc.hint else "")
        ) from None


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    run = config.stash.get(_KEY, None)
    if run is not None and collection_path.resolve() in run.skip:
        return True
    return None


def pytest_collectreport(report: Any) -> None:
    run = _current
    if run is None:
        return
    if report.failed:
        run.note(report.nodeid, "error", 0.0)
    elif report.skipped and report.nodeid.endswith(".py"):
        run.note(report.nodeid, "skipped", 0.0)  # a module that skips itself


def pytest_deselected(items: list[pytest.Item]) -> None:
    if _current is not None and items:
        _current.partial = True


def pytest_collection_finish(session: pytest.Session) -> None:
    run = _current
    if run is not None:
        run.selected = {item.nodeid for item in session.items}
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(run.plan.describe())


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    run = _current
    if run is None:
        return
    if report.failed:
        outcome = "failed" if report.when == "call" else "error"
        run.note(report.nodeid, outcome, report.duration)
    elif report.when == "call" or report.skipped:
        run.note(report.nodeid, report.outcome, report.duration)
    else:
        run.note(report.nodeid, "passed", report.duration)


_current: _Run | None = None


def pytest_sessionstart(session: pytest.Session) -> None:
    global _current
    _current = session.config.stash.get(_KEY, None)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    run = session.config.stash.get(_KEY, None)
    if run is None:
        return
    run.finish(int(exitstatus))
    if run.failed and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    run = config.stash.get(_KEY, None)
    if run is None:
        return
    for line in run.lines:
        terminalreporter.write_line(line)
