"""A pytest plugin that writes every test's outcome to the JSON file named by
XPU_SERIES_OUTCOMES; `verify` loads it with `-p xpu_series.proofs.pytest_outcomes`."""

from __future__ import annotations

import json
import os
from typing import Any

_OUTCOMES: dict[str, str] = {}
# A later report never hides an earlier failure: a test whose subtests failed
# still gets a passing "call" report for its own body.
_RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}


def _record(nodeid: str, outcome: str) -> None:
    if _RANK[outcome] >= _RANK.get(_OUTCOMES.get(nodeid, "passed"), 0):
        _OUTCOMES[nodeid] = outcome


def pytest_collectreport(report: Any) -> None:
    if report.failed:
        _record(report.nodeid, "error")


def pytest_runtest_logreport(report: Any) -> None:
    if report.failed:
        _record(report.nodeid, "failed" if report.when == "call" else "error")
    elif report.when == "call" or report.skipped:
        _record(report.nodeid, report.outcome)


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    path = os.environ.get("XPU_SERIES_OUTCOMES")
    if path:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(_OUTCOMES, fh, indent=1, sort_keys=True)
