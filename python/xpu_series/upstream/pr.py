"""The pull request body of an export (`pr.md`): upstream's template, filled from the
patch header and the results the tool has measured and cached."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xpu_series.git import Git
from xpu_series.project import Project
from xpu_series.proofs import mutant_worker
from xpu_series.proofs.mutants import PatchMutants, load_accepted, patch_mutants
from xpu_series.proofs.proof import Counts, count, load_outcomes, outcome_key
from xpu_series.upstream.export import Export
from xpu_series.upstream.lint import load_hooks

# verify's floor for a mutant's run: part of the key its outcomes are cached under
# (commands/verify.py MUTANT_TIMEOUT_FLOOR_S; if the two drift, the table says
# "not run", never a wrong result).
_MUTANT_TIMEOUT_FLOOR_S = 10.0


@dataclass
class Evidence:
    """The measured results pr.md quotes, each None where none is cached."""

    without: Counts | None = None
    with_patch: Counts | None = None
    mutants: PatchMutants | None = None
    check: dict[str, Any] | None = None
    audit: list[str] | None = None


def _cached_counts(project: Project, tree_id: str, tests: list[str]) -> Counts | None:
    """verify's outcomes of `tests` on a tree, from its cache: a run of exactly
    these tests, or of more tests on the same tree."""
    cache = project.cache_dir / "outcomes"
    outcomes = load_outcomes(cache, outcome_key(project, tree_id, tests))
    if outcomes is None:
        for entry in sorted((cache / "by-tree" / tree_id).glob("*.json")):
            try:
                stored = json.loads(entry.read_text())["tests"]
                key = outcome_key(project, tree_id, stored)
            except (OSError, ValueError, KeyError, TypeError):
                continue
            found = load_outcomes(cache, key)
            if found is not None and count(found, tuple(tests)).total:
                outcomes = found
                break
    if outcomes is None:
        return None
    counts = count(outcomes, tuple(tests))
    return counts if counts.total else None


def _cached_mutants(
    project: Project, git: Git, parent: str, commit: str, name: str, tests: list[str]
) -> PatchMutants | None:
    made = patch_mutants(git, parent, commit)
    tree_id = git.out("rev-parse", f"{commit}^{{tree}}")
    h = hashlib.sha256(outcome_key(project, tree_id, list(tests)).encode())
    h.update(Path(mutant_worker.__file__).read_bytes())
    h.update(str(_MUTANT_TIMEOUT_FLOOR_S).encode())
    for mutant in made:
        h.update(f"\0{mutant.id}\0{mutant.path}\0".encode())
        h.update(mutant.code.encode())
    outcomes = load_outcomes(project.cache_dir / "mutants", h.hexdigest())
    if outcomes is None or not made:
        return None
    accepted = {i: r for (n, i), r in load_accepted(project.root).items() if n == name}
    return PatchMutants(name, tuple(tests), made, outcomes, accepted)


def _audit_findings(project: Project, export: Export) -> list[str] | None:
    """The audit's findings this change removes: results of its SARIF report
    (build/reports/audit.sarif, written by CI's audit step) that it marks as
    changed by the series, in a file and function this export changes. None
    when there is no report."""
    path = project.build_dir / "reports" / "audit.sarif"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    functions = {f.split(": ", 1)[-1].split(".")[-1] for f in export.functions}
    found = []
    for run in data.get("runs", []) if isinstance(data, dict) else []:
        for result in run.get("results", []):
            why = " ".join(
                s.get("justification", "") for s in result.get("suppressions", [])
            )
            if "series" not in why:
                continue  # exposed, or triaged with a reason: not this change's
            try:
                where = result["locations"][0]
                uri = where["physicalLocation"]["artifactLocation"]["uri"]
                line = where["physicalLocation"]["region"]["startLine"]
                function = where["logicalLocations"][0]["fullyQualifiedName"]
            except (KeyError, IndexError, TypeError):
                continue
            if not any(c.endswith(uri) or uri.endswith(c) for c in export.code):
                continue
            if functions and function.split(".")[-1] not in functions:
                continue
            text = result.get("message", {}).get("text", "")
            found.append(f"`{result.get('ruleId', '?')}` at `{uri}:{line}`: {text}")
    return found


def gather(project: Project, export: Export, tree: Path) -> Evidence:
    """What the caches hold for this patch, and the --check of this revision."""
    git = Git(tree)
    target = export.target
    parent = git.out("rev-parse", f"{target.commit}^")
    tests = list(target.header.tests)
    evidence = Evidence()
    evidence.without = _cached_counts(
        project, git.out("rev-parse", f"{parent}^{{tree}}"), tests
    )
    evidence.with_patch = _cached_counts(
        project, git.out("rev-parse", f"{target.commit}^{{tree}}"), tests
    )
    evidence.mutants = _cached_mutants(
        project, git, parent, target.commit, target.patch.name,
        list(target.header.fast_tests),
    )  # fmt: skip
    check = export.folder / "check.json"
    if check.is_file():
        evidence.check = json.loads(check.read_text())
    evidence.audit = _audit_findings(project, export)
    return evidence


def _paragraphs(text: str) -> list[str]:
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", text.strip()) if p]


def _speed(export: Export) -> str:
    """Whether the change can affect speed, from where it lands."""
    code = export.code
    where = ", ".join(f"`{f}`" for f in export.functions) or "(no Python code)"
    if all(p.startswith("python/sglang/test/") for p in code):
        return (
            "Not affected: the change is in the test harness "
            f"({where}), which no server imports."
        )
    if all("/arg_groups/" in p or p.endswith("server_args.py") for p in code):
        return (
            f"Not affected: the change is in argument resolution ({where}), which "
            "runs once when the server starts, never during a request."
        )
    names = [f.split(": ", 1)[1] for f in export.functions]
    if names and all(n.endswith("__init__") for n in names):
        return (
            f"Not affected: the change is in constructors ({where}), which run "
            "once when the object is built, never during a request."
        )
    return (
        f"Not measured. The changed code is in {where}; if a reviewer expects "
        "any of it on a request's path, `python -m sglang.benchmark."
        "offline_throughput` before and after is the measurement to ask for."
    )


def render(project: Project, export: Export, evidence: Evidence) -> str:
    """pr.md: a title and upstream's template headings, filled in."""
    target = export.target
    header = target.header
    paras = _paragraphs(header.description)
    motivation, modifications = paras[:1], paras[1:]
    tests_cmd = " ".join(export.test_paths)
    lines = [f"# {header.subject}", ""]
    lines += [f"<!-- {target.patch.name}, export v{export.revision} -->", ""]
    lines += ["## Motivation", "", *_joined(motivation)]
    if header.get("Origin"):
        lines += ["", f"Origin: {header.get('Origin')}."]
    if export.depends:
        lines += [
            "",
            "This pull request builds on "
            + ", ".join(f"`{d}`" for d in export.depends)
            + " (exported beside this one; merge that first): it changes the same "
            "lines.",
        ]
    lines += ["", "## Modifications", "", *_joined(modifications)]
    lines += ["", "Files:"]
    lines += [f"- `{p}`" for p in export.code]
    for test in export.tests:
        lines.append(f"- `{test.path}` (new): registered for CPU CI")
        for _module, names in test.inlined:
            lines.append(
                f"  - defines {', '.join(f'`{n}`' for n in names)} itself: it "
                "imports only sglang, the standard library and unittest"
            )
        for dropped in test.dropped:
            lines.append(f"  - leaves out `{dropped}`")
    for path in export.left_out:
        lines.append(
            f"- not carried: `{path.split(' (')[0]}` ({path.split(' (', 1)[1]}"
        )
    for path in export.data_paths:
        lines.append(f"- `{path}` (new): a file the test reads")
    lines += ["", "## Accuracy Tests", ""]
    lines += _accuracy(export, evidence, tests_cmd)
    lines += ["", "## Speed Tests and Profiling", "", _speed(export)]
    lines += ["", "## Checklist", ""]
    lint = _step(evidence, "lint")
    hooks = ", ".join(f"{h.id} {h.version}" for h in load_hooks())
    lines.append(
        f"- [{'x' if lint and lint['ok'] else ' '}] Formatted and linted with the "
        f"hooks of upstream's pre-commit config ({hooks})"
        + ("" if lint else ": not checked yet (`xpu-series upstream --check`)")
    )
    proof = [_step(evidence, "fail-without"), _step(evidence, "pass-with")]
    ok = all(step is not None and step["ok"] for step in proof)
    lines.append(
        f"- [{'x' if ok else ' '}] Unit tests added under `test/registered/unit/`: "
        "they fail on upstream without the change and pass with it"
    )
    lines.append(
        "- [ ] Documentation: no option or documented behaviour changes"
        " (reviewer to confirm)"
    )
    lines.append(
        "- [x] Accuracy and speed: stated above, with the commands that measured them"
    )
    if header.get("Forwarded"):
        lines += ["", f"Forwarded: {header.get('Forwarded')}"]
    return "\n".join(lines).rstrip() + "\n"


def _joined(paras: list[str]) -> list[str]:
    out: list[str] = []
    for para in paras:
        out += [para, ""]
    return out[:-1] if out else ["(see the title)"]


def _step(evidence: Evidence, name: str) -> dict[str, Any] | None:
    if not evidence.check:
        return None
    for step in evidence.check.get("steps", []):
        if step.get("step") == name:
            return step
    return None


def _accuracy(export: Export, evidence: Evidence, tests_cmd: str) -> list[str]:
    out = [
        "Model outputs: not affected beyond what the tests below state; the change "
        "is exercised by its unit tests, on CPU.",
        "",
    ]
    check = evidence.check
    base = "upstream" + "".join(f" + `{d}`" for d in export.depends)
    if check:
        without, with_ = _step(evidence, "fail-without"), _step(evidence, "pass-with")
        out += [
            "On this pull request's own tree (`xpu-series upstream "
            f"{export.target.stem} --check`):",
            "",
            "| tree | result |",
            "|---|---|",
            f"| {base} + the new tests only | "
            f"{without['summary'].split(': ', 1)[-1] if without else 'not run'} |",
            f"| {base} + this pull request | "
            f"{with_['summary'].split(': ', 1)[-1] if with_ else 'not run'} |",
            "",
        ]
    else:
        out += [
            "Not yet run on this pull request's own tree: "
            f"`xpu-series upstream {export.target.stem} --check` fills this in.",
            "",
        ]
    out += [f"Run them: `python -m pytest {tests_cmd} -v`.", ""]
    if evidence.without and evidence.with_patch:
        out.append(
            f"In the downstream series (`xpu-series verify {export.target.stem[:4]}`): "
            f"without the change {evidence.without}; with it {evidence.with_patch}."
        )
    else:
        out.append(
            "`xpu-series verify` has no cached result for this revision of the "
            "series: not quoted."
        )
    mutants = evidence.mutants
    if mutants:
        accepted = sum(m.id in mutants.accepted for m in mutants.survivors)
        out += [
            "",
            f"Mutants of the added lines (`xpu-series verify --mutants "
            f"{export.target.stem[:4]}`, tests: "
            f"{', '.join(f'`{t}`' for t in mutants.tests)}):",
            "",
            "| mutants | killed | survived, accepted with a reason | survived |",
            "|---|---|---|---|",
            f"| {len(mutants.made)} | {mutants.killed} | {accepted} | "
            f"{len(mutants.unaccepted)} |",
        ]
        for mutant in mutants.survivors:
            reason = mutants.accepted.get(mutant.id, "not accepted")
            out.append(f"- `{mutant.diff.strip()}`: {reason}")
    else:
        out += [
            "",
            "`xpu-series verify --mutants` has no cached result for this revision "
            "of the series: not quoted.",
        ]
    if evidence.audit:
        out += ["", "The audit's findings this removes: " + "; ".join(evidence.audit)]
    elif evidence.audit is None:
        out += [
            "",
            "No audit report (`xpu-series audit --sarif build/reports/audit.sarif`)"
            " to quote.",
        ]
    else:
        out += ["", "The audit report names no finding this change removes."]
    return out
