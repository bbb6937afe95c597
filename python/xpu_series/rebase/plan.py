"""The rebase's plan: the decisions it takes, and what the move does to the
requirements of the test environment (dependency drift)."""

from __future__ import annotations

import re
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

from xpu_series.errors import UsageError
from xpu_series.stack.operation import Operation
from xpu_series.stack.plan import Decision, parse_plan

# Where a patch goes that the rebase does not carry: retired (upstream has it) or
# dropped (with a reason).
UPSTREAMED = "upstreamed"
DROPPED = "dropped"
# Each finished rebase's decisions, replayable: patches/moves/OLD-to-NEW.plan.
MOVES = "moves"
_REQ = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*(.*)$")


# -- the decisions ------------------------------------------------------------


def read_plan(plan: Path, names: list[str], onto: str) -> list[Decision]:
    """The decisions of the plan file `plan`, checked against the series' `names`
    and the release `onto` before anything changes."""
    try:
        text = plan.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read the plan {plan}: {exc.strerror}") from None
    return parse_plan(text, names, onto, str(plan))


def decisions_of(op: Operation) -> list[Decision]:
    """Every decision of the rebase: the plan's (retire, drop, edit) and those of
    --skip, in series order."""
    out = []
    edits = {d["name"] for d in op.plan if d["action"] == "edit"}
    for done in op.done:
        if done["name"] in edits:
            out.append(Decision("edit", done["name"], ""))
            continue
        if done.get("commit") or not done.get("reason"):
            continue
        retire = bool(done.get(UPSTREAMED))
        out.append(
            Decision(
                "retire" if retire else "drop",
                done["name"],
                done["reason"],
                done.get("since") or (op.target["version"] if retire else ""),
            )
        )
    return out


# -- dependency drift ---------------------------------------------------------


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requires_dist(wheel: Path) -> dict[str, str]:
    """name -> specifier of a wheel's unconditional Requires-Dist lines."""
    with zipfile.ZipFile(wheel) as archive:
        meta = next(
            (n for n in archive.namelist() if n.endswith(".dist-info/METADATA")), None
        )
        text = archive.read(meta).decode("utf-8", "replace") if meta else ""
    reqs: dict[str, str] = {}
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        value = line.split(":", 1)[1].strip()
        if ";" in value and "extra" in value.split(";", 1)[1]:
            continue
        match = _REQ.match(value.split(";", 1)[0].strip())
        if match:
            spec = match.group(3).strip().strip("()")
            reqs[_norm(match.group(1))] = spec
    return reqs


def pinned_test_env(pyproject: Path) -> dict[str, str]:
    """name -> version that pyproject.toml pins with `==` for the test environment."""
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return {}
    entries = list(data.get("project", {}).get("optional-dependencies", {}).get(
        "test", []))  # fmt: skip
    entries += data.get("tool", {}).get("xpu-series", {}).get("no-deps", [])
    pins: dict[str, str] = {}
    for entry in entries:
        name, sep, version = entry.partition("==")
        if sep:
            pins[_norm(name.strip())] = version.strip()
    return pins


def _satisfies(version: str, spec: str) -> bool | None:
    try:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
        from packaging.version import InvalidVersion
    except ImportError:  # pragma: no cover - packaging ships with pip's users
        return None
    try:
        return SpecifierSet(spec).contains(version, prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return None


@dataclass
class DriftRow:
    """One requirement that differs between the old and the new release."""

    name: str
    old: str
    new: str
    pinned: str
    action: str

    def to_json(self) -> dict[str, str]:
        return self.__dict__.copy()


def _shown(spec: str | None) -> str:
    """A requirement for the table: '-' when absent, 'any' when unversioned."""
    return "-" if spec is None else spec or "any"


Requirements = dict[str, str]


def dependency_drift(
    before: Requirements, after: Requirements, pins: Requirements
) -> list[DriftRow]:
    """What changed between the two releases' requirements, and what that change
    asks of the test environment (only what the change itself causes).
    `before`/`after`: the two wheels' requires_dist(); `pins`: pinned_test_env()."""
    rows = []
    for name in sorted(set(before) | set(after)):
        if before.get(name) == after.get(name):
            continue
        spec = after.get(name)
        pinned = pins.get(name, "")
        if spec is None:
            action = "no longer required" + (
                f": the test environment may drop {name}" if pinned else ""
            )
        elif not pinned:
            action = "not in the test environment"
        else:
            fits = _satisfies(pinned, spec)
            fitted = _satisfies(pinned, before[name]) if name in before else True
            if fits is False and fitted is False:
                action = f"{name}=={pinned} did not satisfy the old release either"
            else:
                action = {
                    False: f"change pyproject.toml: {name}=={pinned} does not "
                    f"satisfy {spec}",
                    True: "the pinned version still satisfies it",
                    None: f"compare {name}=={pinned} with {spec} by hand",
                }[fits]
        rows.append(
            DriftRow(name, _shown(before.get(name)), _shown(spec), pinned, action)
        )
    return rows


def environment_violations(
    before: Requirements, after: Requirements, pins: Requirements
) -> list[DriftRow]:
    """Every pin of the test environment the new release's requirements reject,
    changed or not, and whether the old release rejected it too."""
    rows = []
    for name, pinned in sorted(pins.items()):
        spec = after.get(name)
        if spec is None or _satisfies(pinned, spec) is not False:
            continue
        was = before.get(name)
        old_too = was is not None and _satisfies(pinned, was) is False
        rows.append(
            DriftRow(
                name,
                _shown(was),
                _shown(spec),
                pinned,
                "unmet by the old release too"
                if old_too
                else "unmet from this release",
            )
        )
    return rows
