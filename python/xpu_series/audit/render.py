"""An audit report as text, Markdown, JSON or SARIF 2.1.0 (GitHub code scanning).

The text and Markdown views put the summary first, then what needs a person: the
exposed findings (with `--since`, every new one that is not guarded, unreached or
harmless), stale triage and ledger entries, files that did not parse. Triaged,
patched, guarded, unreached and harmless findings, and what each triage entry
covers, are listed with `--all`.
"""

from __future__ import annotations

from typing import Any

from xpu_series import __version__
from xpu_series.audit.analysis import EXPOSED, VERDICTS, AuditReport, Finding, grouped
from xpu_series.audit.kinds import RULES
from xpu_series.audit.scan_records import KINDS

SHOWN = (EXPOSED, "triaged", "patched")  # listed per concern by --since and SARIF
EFFECTS = (
    "raises",
    "wrong-result",
    "silent-zero",
    "feature-off",
    "no-op",
    "wrong-device",
    "skips-xpu",
)


def _counts_line(title: str, counts: dict[str, int], order: tuple[str, ...]) -> str:
    keys = [k for k in order if k in counts] + sorted(set(counts) - set(order))
    body = ", ".join(f"{k} {counts[k]}" for k in keys) or "none"
    return f"{title}: {body}"


def summary_lines(report: AuditReport) -> list[str]:
    lines = [
        f"audited: {report.label}"
        + (f" (new since {report.since})" if report.since else ""),
        f"files: {report.files}, modules an XPU server imports: {report.reached} "
        f"of {report.modules}",
        _counts_line("verdicts", report.count("verdict"), VERDICTS)
        + f"; the series fixes {sum(f.patched for f in report.findings)}",
        _counts_line(
            "effects (exposed)", dict(_exposed_effects(report.findings)), EFFECTS
        ),
        "by kind:",
    ]
    for kind, verdicts in report.by_kind().items():
        lines.append(_counts_line(f"  {kind}", verdicts, VERDICTS))
    if report.surface is not None:
        lines.append(
            f"kernel surface: {report.surface.describe()} "
            f"(commit {report.surface.commit})"
        )
    if report.ledger is not None:
        ledger = report.ledger
        lines.append(
            f"ledger: {len(ledger.reports)} reports on {ledger.release}: "
            + (
                ", ".join(f"{k} {v}" for k, v in sorted(ledger.statuses().items()))
                or "none listed"
            )
            + f"; stale {len(ledger.stale)}, not seen by a rule "
            f"{len(ledger.unseen)}"
        )
    lines.append(
        f"executed on the stand-in: {sum(f.executed for f in report.findings)}"
        f" ({report.executed_source or 'no recorded run for this tree'})"
    )
    return lines


def _listed(report: AuditReport, everything: bool) -> list[Finding]:
    """The findings a view lists: all with --all; else the exposed ones and the
    new ones a person must look at even when triaged (with --since, new since
    that release; on the tree with the series, what the series adds)."""
    if everything:
        return report.findings
    shown = SHOWN if report.since else (EXPOSED,)
    added = {id(f) for f in report.introduced}
    return [
        f
        for f in report.findings
        if (f.verdict in shown and not f.patched) or id(f) in added
    ]


def _exposed_effects(findings: list[Finding]) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for f in findings:
        if f.verdict == EXPOSED:
            counts[f.effect] = counts.get(f.effect, 0) + 1
    return sorted(counts.items())


def render_text(report: AuditReport, verbose: bool = False) -> str:
    lines = summary_lines(report)
    lines.append("")
    listed = _listed(report, verbose)
    for (file, function), items in grouped(listed):
        lines.append(f"{file.removeprefix('python/')}: {function}")
        for f in items:
            ran = ", executed" if f.executed else ""
            fixed = (
                " (the series fixes it)" if f.patched and f.verdict != "patched" else ""
            )
            lines.append(
                f"  {f.line}: {f.api} [{f.kind}, {f.effect}{ran}] {f.verdict}{fixed}"
            )
            if f.verdict == EXPOSED and f.replacement:
                lines.append(f"      use: {f.replacement}")
            elif f.verdict != EXPOSED and f.reason:
                lines.append(f"      {f.reason}")
    if not listed:
        lines.append(
            "no exposed finding"
            + (f" new since {report.since}" if report.since else "")
        )
    if report.introduced:
        lines.append(
            f"new with the series (not in the release as shipped): "
            f"{len(report.introduced)}, listed above"
        )
    for path, error in report.parse_errors:
        lines.append(f"warning: {path} {error}; the audit skipped it")
    if verbose:
        for entry, covered in report.triage:
            if covered > 1:
                lines.append(
                    f"triage: audit.toml:{entry.line} ({entry.describe()}) covers "
                    f"{covered} findings"
                )
    for entry in report.stale:
        lines.append(
            f"stale: audit.toml:{entry.line} ({entry.describe()}) matches no "
            "finding; remove it"
        )
    if report.ledger is not None:
        for entry, why in report.ledger.stale:
            lines.append(
                f"stale: xpu-reports.toml:{entry.line} {entry.url} "
                f"({entry.describe()}): {why} on {report.ledger.release}"
            )
    if not verbose:
        lines.append(
            "(--all lists the triaged, patched, guarded, unreached and harmless "
            "findings too, with each triage entry's coverage)"
        )
    return "\n".join(lines)


def render_markdown(report: AuditReport, verbose: bool = False) -> str:
    """A job-summary table: the exposed and new findings, one row each."""
    lines = [f"### xpu-series audit: {report.label}", ""]
    lines += [
        f"- {line}"
        for line in summary_lines(report)
        if not line.startswith(("by kind:", "  "))
    ]
    counts = report.by_kind()
    lines += ["", "| kind | " + " | ".join(VERDICTS) + " |"]
    lines += ["|---|" + "---|" * len(VERDICTS)]
    lines += [
        f"| {kind} | " + " | ".join(str(v.get(x, "")) for x in VERDICTS) + " |"
        for kind, v in counts.items()
    ]
    rows = [
        [
            f"`{f.file.removeprefix('python/')}:{f.line}`",
            f"`{f.function}`",
            f"`{f.api}`",
            f.kind,
            f.effect,
            f.verdict
            + (" (series fixes)" if f.patched and f.verdict != "patched" else ""),
            "yes" if f.executed else "",
        ]
        for _, items in grouped(_listed(report, verbose))
        for f in items
    ]
    if rows:
        head = ["where", "function", "api", "kind", "effect", "verdict", "executed"]
        lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def render_json(report: AuditReport) -> dict[str, Any]:
    return {
        "ok": not report.exposed,
        "patched": sum(f.patched for f in report.findings),
        "tree": report.label,
        "since": report.since or None,
        "files": report.files,
        "modules": report.modules,
        "modules_reached": report.reached,
        "counts": {
            "verdict": report.count("verdict"),
            "effect": report.count("effect"),
            "kind": report.by_kind(),
            "executed": sum(f.executed for f in report.findings),
        },
        "surface": report.surface.to_json() if report.surface else None,
        "ledger": report.ledger.to_json() if report.ledger else None,
        "findings": [f.to_json() for f in report.findings],
        "parse_errors": [{"file": p, "error": e} for p, e in report.parse_errors],
        "triage": [
            {
                "line": e.line,
                "file": e.file,
                "function": e.function,
                "api": e.api,
                "kind": e.kind,
                "reason": e.reason,
                "covers": n,
            }
            for e, n in report.triage
        ],
        "stale": [e.line for e in report.stale],
        "new_with_series": [f.fingerprint() for f in report.introduced],
        "executed_source": report.executed_source,
        "cached": report.cached,
    }


_LEVEL = {"exposed": "error", "triaged": "note", "patched": "note"}


def render_sarif(report: AuditReport) -> dict[str, Any]:
    """SARIF 2.1.0: one rule per finding kind; exposed findings are errors,
    triaged ones carry their reason as a suppression."""
    rules = [
        {
            "id": kind,
            "name": kind.replace("-", " ").title().replace(" ", ""),
            "shortDescription": {"text": RULES[kind]},
            "helpUri": "https://github.com/sgl-project/sglang",
        }
        for kind in KINDS
    ]
    results = []
    for f in report.findings:
        if f.verdict not in _LEVEL:
            continue
        level = "note" if f.patched else _LEVEL[f.verdict]
        text = f"{f.api} in {f.function}: {f.effect} on XPU."
        if f.replacement:
            text += f" Use {f.replacement}."
        result: dict[str, Any] = {
            "ruleId": f.kind,
            "ruleIndex": KINDS.index(f.kind),
            "level": level,
            "message": {"text": text},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": f.file},
                        "region": {"startLine": max(f.line, 1)},
                    },
                    "logicalLocations": [
                        {"fullyQualifiedName": f.function, "kind": "function"}
                    ],
                }
            ],
            "partialFingerprints": {"xpuSeriesFinding/v1": f.fingerprint()},
            "properties": {"effect": f.effect, "executed": f.executed},
        }
        if f.verdict != EXPOSED or f.patched:
            result["suppressions"] = [
                {"kind": "external", "justification": f.reason or f.verdict}
            ]
        results.append(result)
    return {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "xpu-series audit",
                        "version": __version__,
                        "informationUri": "https://github.com/sgl-project/sglang",
                        "rules": rules,
                    }
                },
                "results": results,
            }
        ],
    }
