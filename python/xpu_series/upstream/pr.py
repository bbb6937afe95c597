"""The pull request body of an export (`pr.md`): upstream's template, filled from the
patch headers, patches/upstream-work.toml and the results the tool has measured and
cached."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpu_series.git import Git
from xpu_series.project import Project
from xpu_series.proofs import mutant_worker
from xpu_series.proofs.mutants import PatchMutants, load_accepted, patch_mutants
from xpu_series.proofs.proof import Counts, count, load_outcomes, outcome_key
from xpu_series.stack.header import PatchHeader
from xpu_series.upstream.export import Export, Part
from xpu_series.upstream.lint import load_hooks
from xpu_series.upstream.related import UpstreamWork, load_upstream_work

# verify's floor for a mutant's run: part of the key its outcomes are cached under
# (commands/verify.py MUTANT_TIMEOUT_FLOOR_S; if the two drift, the table says
# "not run", never a wrong result).
_MUTANT_TIMEOUT_FLOOR_S = 10.0


@dataclass
class PatchEvidence:
    """What verify's caches hold for one patch of the export (None: nothing)."""

    without: Counts | None = None
    with_patch: Counts | None = None
    mutants: PatchMutants | None = None


@dataclass
class Evidence:
    """The measured results and recorded facts pr.md quotes."""

    patches: dict[str, PatchEvidence] = field(default_factory=dict)
    check: dict[str, Any] | None = None
    audit: list[str] | None = None
    work: UpstreamWork = field(default_factory=UpstreamWork)


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
    cache = project.cache_dir / "mutants"
    # Making the mutants parses every file the patch changes (seconds a patch):
    # when verify --mutants has stored no outcome at all, no key can be found.
    if not any(cache.glob("*.json")):
        return None
    made = patch_mutants(git, parent, commit)
    tree_id = git.out("rev-parse", f"{commit}^{{tree}}")
    h = hashlib.sha256(outcome_key(project, tree_id, list(tests)).encode())
    h.update(Path(mutant_worker.__file__).read_bytes())
    h.update(str(_MUTANT_TIMEOUT_FLOOR_S).encode())
    for mutant in made:
        h.update(f"\0{mutant.id}\0{mutant.path}\0".encode())
        h.update(mutant.code.encode())
    outcomes = load_outcomes(cache, h.hexdigest())
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
    """What the caches hold for each patch, the --check of this revision, and
    patches/upstream-work.toml."""
    git = Git(tree)
    evidence = Evidence(work=load_upstream_work(project))
    for target in export.targets:
        parent = git.out("rev-parse", f"{target.commit}^")
        tests = list(target.header.tests)
        found = PatchEvidence()
        found.without = _cached_counts(
            project, git.out("rev-parse", f"{parent}^{{tree}}"), tests
        )
        found.with_patch = _cached_counts(
            project, git.out("rev-parse", f"{target.commit}^{{tree}}"), tests
        )
        found.mutants = _cached_mutants(
            project, git, parent, target.commit, target.patch.name,
            list(target.header.fast_tests),
        )  # fmt: skip
        evidence.patches[target.patch.name] = found
    check = export.folder / "check.json"
    if check.is_file():
        evidence.check = json.loads(check.read_text())
    evidence.audit = _audit_findings(project, export)
    return evidence


def _paragraphs(text: str) -> list[str]:
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", text.strip()) if p]


def _plain(subject: str) -> str:
    return subject.removeprefix("[XPU] ")


def _command(export: Export, option: str) -> str:
    """The `xpu-series upstream` command that makes this export with `option`."""
    if export.bundle is not None:
        return f"xpu-series upstream --bundle {export.name} {option}"
    return f"xpu-series upstream {export.name} {option}"


class _Notes:
    """Footnotes, numbered in order of first use: where each change comes
    from, which matters to a reader after the failure and the fix."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def mark(self, header: PatchHeader) -> str:
        origin = header.get("Origin").strip()
        # DEP-3's category word says nothing to a reviewer.
        text = origin.split(", ", 1)[1] if origin.startswith("other, ") else origin
        if not text:
            return ""
        text = f"Origin: {text.rstrip('.')}."
        if text not in self.texts:
            self.texts.append(text)
        return f"[^{self.texts.index(text) + 1}]"

    def lines(self) -> list[str]:
        return [f"[^{n}]: {text}" for n, text in enumerate(self.texts, start=1)]


def render(project: Project, export: Export, evidence: Evidence) -> str:
    """pr.md: upstream's template headings, led by what fails on XPU and the
    fix, with the related upstream work and upstream's own tests it changes."""
    notes = _Notes()
    lines = [f"# {_title(export)}", ""]
    stems = ", ".join(t.patch.name for t in export.targets)
    label = f"bundle {export.name}: {stems}" if export.bundle else stems
    lines += [f"<!-- {label}, export v{export.revision} -->", ""]
    lines += ["## Motivation", "", *_motivation(export, notes)]
    lines += ["", "## Related upstream work", "", *_related(export, evidence.work)]
    lines += ["", "## Modifications", "", *_modifications(export)]
    lines += ["", "## Upstream tests this changes", ""]
    lines += _upstream_tests(export, evidence.work)
    lines += ["", "## Accuracy Tests", "", *_accuracy(export, evidence)]
    lines += ["", "## Speed Tests and Profiling", "", _speed(export)]
    lines += ["", "## Checklist", "", *_checklist(export, evidence)]
    forwarded = dict.fromkeys(
        t.header.get("Forwarded") for t in export.targets if t.header.get("Forwarded")
    )
    lines += [line for url in forwarded for line in ("", f"Forwarded: {url}")]
    if notes.texts:
        lines += ["", *notes.lines()]
    return "\n".join(lines).rstrip() + "\n"


def _title(export: Export) -> str:
    bundle = export.bundle
    if bundle is None:
        return export.targets[0].header.subject
    if bundle.title:
        return bundle.title
    return "[XPU] " + "; ".join(_plain(t.header.subject) for t in export.targets)


def _motivation(export: Export, notes: _Notes) -> list[str]:
    """The failure on XPU and the fix: the first two paragraphs of each
    patch's description (a bundle's own motivation first)."""
    out: list[str] = []
    bundle = export.bundle
    if bundle is not None and bundle.motivation:
        out += [*_joined(_paragraphs(bundle.motivation)), ""]
    for target in export.targets:
        paras = _paragraphs(target.header.description) or [target.header.subject]
        if bundle is not None:
            out += [f"**{_plain(target.header.subject)}** (`{target.stem}`)", ""]
        out += [paras[0] + notes.mark(target.header), ""]
        out += [paras[1], ""] if len(paras) > 1 else []
    return out[:-1]


_STATE = {"open": "open", "closed-unmerged": "closed, not merged", "merged": "merged"}


def _related(export: Export, work: UpstreamWork) -> list[str]:
    """Each related pull request or issue, as last seen, and how this differs."""
    out = [
        "Upstream pull requests and issues on the same failure or code, as last "
        "seen, and how this pull request differs from each:",
        "",
    ]
    bundle = export.bundle is not None
    for target in export.targets:
        entries = work.related_to(target.stem)
        indent = "  " if bundle else ""
        if bundle:
            out.append(f"- `{target.stem}`:")
        for e in entries:
            out.append(
                f"{indent}- [{e.label}]({e.url}) ({_STATE[e.state]}, as of "
                f"{e.seen.isoformat()}): {e.differs}"
            )
        if not entries:
            searched = work.searched.get(target.stem)
            out.append(
                f"{indent}- none found (searched {searched.isoformat()})"
                if searched
                else f"{indent}- not searched yet"
            )
    return out


def _modifications(export: Export) -> list[str]:
    out: list[str] = []
    if export.depends:
        out += [
            "This pull request builds on "
            + ", ".join(f"`{d}`" for d in export.depends)
            + " (exported beside this one; merge that first): it changes the same "
            "lines.",
            "",
        ]
    if export.bundle is not None:
        out += ["One commit per change, in this order:", ""]
        out += [
            f"{n}. {_plain(t.header.subject)}"
            for n, t in enumerate(export.targets, start=1)
        ]
        out.append("")
    for part in export.parts:
        header = part.target.header
        if export.bundle is not None:
            out += [f"### {_plain(header.subject)}", ""]
        rest = _paragraphs(header.description)[2:]
        out += [*_joined(rest), ""] if rest else []
        out += [*_files(part), ""]
    return out[:-1]


def _files(part: Part) -> list[str]:
    out = ["Files:", *(f"- `{p}`" for p in part.code)]
    for test in part.tests:
        out.append(f"- `{test.path}` (new): registered for CPU CI")
        for _module, names in test.inlined:
            out.append(
                f"  - defines {', '.join(f'`{n}`' for n in names)} itself: it "
                "imports only sglang, the standard library and unittest"
            )
        for dropped in test.dropped:
            out.append(f"  - leaves out `{dropped}`")
    shipped = {t.path for t in part.tests}
    for path in part.test_paths:
        if path not in shipped:
            out.append(f"- `{path}`: its tests too (added by an earlier commit)")
    for path in part.left_out:
        out.append(f"- not carried: `{path.split(' (')[0]}` ({path.split(' (', 1)[1]}")
    for test in part.tests:
        out += [f"- `{path}` (new): a file the test reads" for path, _d in test.data]
    return out


def _upstream_tests(export: Export, work: UpstreamWork) -> list[str]:
    """Upstream's own tests that pin the old behaviour: the pull request must
    update them (the release wheel carries no tests, so the export cannot)."""
    found = [t for target in export.targets for t in work.tests_of(target.stem)]
    out: list[str] = []
    if found:
        out += [
            "These tests in upstream's tree assert the behaviour this pull request "
            "changes, and must be updated in it: they are not in the release this "
            "was exported against, so the commits above do not touch them.",
            "",
        ]
        for t in found:
            at = f"read at `{t.commit[:12]}`, " if t.commit else "read "
            of = f" (`{t.patch}`)" if export.bundle is not None else ""
            out.append(f"- `{t.path}`{of} ({at}{t.seen.isoformat()}): {t.breaks}")
    for target in export.targets:
        if work.tests_of(target.stem):
            continue
        of = f" for `{target.stem}`" if export.bundle is not None else ""
        searched = work.searched.get(target.stem)
        out.append(
            f"- None found{of}: no upstream test of the changed code was seen to "
            f"pin the old behaviour (searched {searched.isoformat()})."
            if searched
            else f"- Not searched yet{of}: upstream's own tests of the changed code "
            "may pin the old behaviour."
        )
    return out


def _checklist(export: Export, evidence: Evidence) -> list[str]:
    lint = _step(evidence, "lint")
    hooks = ", ".join(f"{h.id} {h.version}" for h in load_hooks())
    out = [
        f"- [{'x' if lint and lint['ok'] else ' '}] Formatted and linted with the "
        f"hooks of upstream's pre-commit config ({hooks})"
        + ("" if lint else f": not checked yet (`{_command(export, '--check')}`)")
    ]
    proof = [_step(evidence, "fail-without"), _step(evidence, "pass-with")]
    ok = all(step is not None and step["ok"] for step in proof)
    out.append(
        f"- [{'x' if ok else ' '}] Unit tests added under `test/registered/unit/`: "
        "they fail on upstream without the change and pass with it"
    )
    if any(evidence.work.tests_of(t.stem) for t in export.targets):
        out.append(
            "- [ ] Upstream's own tests named above updated to the new behaviour"
        )
    out.append(
        "- [ ] Documentation: no option or documented behaviour changes"
        " (reviewer to confirm)"
    )
    out.append(
        "- [x] Accuracy and speed: stated above, with the commands that measured them"
    )
    return out


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


def _joined(paras: list[str]) -> list[str]:
    out: list[str] = []
    for para in paras:
        out += [para, ""]
    return out[:-1]


def _step(evidence: Evidence, name: str) -> dict[str, Any] | None:
    if not evidence.check:
        return None
    for step in evidence.check.get("steps", []):
        if step.get("step") == name:
            return step
    return None


def _accuracy(export: Export, evidence: Evidence) -> list[str]:
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
            f"On this pull request's own tree (`{_command(export, '--check')}`):",
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
            f"`{_command(export, '--check')}` fills this in.",
            "",
        ]
    out += [f"Run them: `python -m pytest {' '.join(export.test_paths)} -v`."]
    for target in export.targets:
        found = evidence.patches.get(target.patch.name, PatchEvidence())
        out += ["", *_series_evidence(target.stem, found)]
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


def _series_evidence(stem: str, found: PatchEvidence) -> list[str]:
    """verify's fail-without/pass-with counts and the mutants table of one
    patch, from the caches of this revision of the series."""
    if found.without and found.with_patch:
        out = [
            f"In the downstream series (`xpu-series verify {stem[:4]}`): "
            f"without the change {found.without}; with it {found.with_patch}."
        ]
    else:
        out = [
            f"`xpu-series verify {stem[:4]}` has no cached result for this revision "
            "of the series: not quoted."
        ]
    mutants = found.mutants
    if not mutants:
        return out + [
            "",
            f"`xpu-series verify --mutants {stem[:4]}` has no cached result for this "
            "revision of the series: not quoted.",
        ]
    accepted = sum(m.id in mutants.accepted for m in mutants.survivors)
    out += [
        "",
        f"Mutants of the added lines (`xpu-series verify --mutants {stem[:4]}`, "
        f"tests: {', '.join(f'`{t}`' for t in mutants.tests)}):",
        "",
        "| mutants | killed | survived, accepted with a reason | survived |",
        "|---|---|---|---|",
        f"| {len(mutants.made)} | {mutants.killed} | {accepted} | "
        f"{len(mutants.unaccepted)} |",
    ]
    for mutant in mutants.survivors:
        reason = mutants.accepted.get(mutant.id, "not accepted")
        out.append(f"- `{mutant.diff.strip()}`: {reason}")
    return out
