"""A pytest plugin that writes every test's outcome to the JSON file named by
XPU_SERIES_OUTCOMES; `verify` loads it with `-p xpu_series.pytest_outcomes`."""

from __future__ import annotations

import json
import os
from typing import Any

_OUTCOMES: dict[str, str] = {}


def pytest_collectreport(report: Any) -> None:
    if report.failed:
        _OUTCOMES[report.nodeid] = "error"


def pytest_runtest_logreport(report: Any) -> None:
    if report.when == "call" or report.outcome != "passed":
        if report.failed and report.when != "call":
            _OUTCOMES[report.nodeid] = "error"
        elif report.nodeid not in _OUTCOMES or report.when == "call":
            _OUTCOMES[report.nodeid] = report.outcome


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    path = os.environ.get("XPU_SERIES_OUTCOMES")
    if path:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(_OUTCOMES, fh, indent=1, sort_keys=True)
