"""Property tests: arbitrary bytes and near-valid variants fed to the header parser,
the series parser and the patch path checks end in our error with a message, never
a traceback."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xpu_series.errors import XpuSeriesError
from xpu_series.stack.header import header_problems, parse_header, patch_paths
from xpu_series.stack.series import load_series, path_problem, static_problems

VALID_PATCH = (
    "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
    "From: xpu-series <xpu-series@localhost>\n"
    "Subject: [XPU] Raise VALUE\n\nWhy.\n\nUpstream-Status: Pending\n"
    "Concern: device-gates\nTests: test/a.py\n---\n"
    "diff --git a/python/sglang/srt/flags.py b/python/sglang/srt/flags.py\n"
    "--- a/python/sglang/srt/flags.py\n+++ b/python/sglang/srt/flags.py\n"
    "@@ -1 +1 @@\n-VALUE = 1\n+VALUE = 2\n"
)
SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def near_valid(text: str) -> st.SearchStrategy[str]:
    """The valid text with a slice replaced, deleted or duplicated."""
    n = len(text)
    return st.tuples(st.integers(0, n), st.integers(0, n), st.text(max_size=40)).map(
        lambda t: text[: min(t[0], t[1])] + t[2] + text[max(t[0], t[1]) :]
    )


def _loads(directory: Path) -> None:
    """Load and check a series: it may be fine, or fail with our error."""
    try:
        series = load_series(directory)
        problems = static_problems(series, None, ("python/sglang/",))
    except XpuSeriesError as exc:
        assert exc.message
        return
    for problem in problems:
        assert isinstance(problem, str) and problem


@SETTINGS
@given(st.one_of(st.text(), near_valid(VALID_PATCH)))
def test_header_parser_never_raises(text: str) -> None:
    header = parse_header(text)
    assert all(isinstance(p, str) for p in header_problems(header))
    assert all(isinstance(p, str) for p in patch_paths(text))


@SETTINGS
@given(
    st.one_of(
        st.binary(max_size=300),
        near_valid("# series\n0001-raise-value.patch\n").map(str.encode),
    ),
    st.one_of(st.binary(max_size=300), near_valid(VALID_PATCH).map(str.encode)),
)
def test_series_and_patch_files_end_in_our_error(series: bytes, patch: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        (directory / "series").write_bytes(series)
        (directory / "0001-raise-value.patch").write_bytes(patch)
        _loads(directory)


@SETTINGS
@given(
    st.one_of(
        st.text(max_size=80),
        st.lists(st.sampled_from(["..", ".", "python", "sglang", "/", "~", "a b"])).map(
            "/".join
        ),
    )
)
def test_path_checks_return_a_reason_or_none(path: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        problem = path_problem(path, Path(tmp))
    assert problem is None or (isinstance(problem, str) and path in problem)
    if ".." in Path(path).parts or path.startswith(("/", "~")):
        assert problem is not None
