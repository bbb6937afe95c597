"""Render results as aligned text tables (the CLI's only output format besides JSON)."""

from __future__ import annotations

from collections.abc import Sequence

from xpu_series.result import Report


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns separated by two spaces.

    >>> print(table(["a", "bb"], [["xyz", "1"]]))
    a    bb
    xyz  1
    """
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [list(headers), *rows]
    ]
    return "\n".join(lines)


def _files(files: Sequence[str]) -> str:
    short = [f.removeprefix("python/sglang/") for f in files]
    if len(short) > 2:
        return f"{', '.join(short[:2])} +{len(short) - 2}"
    return ", ".join(short)


def render_report(report: Report) -> str:
    lines: list[str] = []
    if report.upstream:
        up = report.upstream
        pinned = "pinned" if up.pinned else "not the pin"
        sha = f", sha256 {up.sha256[:12]}" if up.sha256 else ""
        lines.append(f"upstream: sglang {up.version} ({up.source}, {pinned}{sha})")
    if report.tree:
        lines.append(f"tree: {report.tree}")
    rows = [
        [p.name, p.concern or "-", str(p.status), _files(p.files)]
        for p in report.patches
    ]
    if rows:
        lines.append("")
        lines.append(table(["patch", "concern", "status", "files"], rows))
    details = [f"  {p.name}: {p.detail}" for p in report.patches if p.detail]
    if details and not report.ok:
        lines.append("")
        lines.extend(details)
    for note in report.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)
