"""The tree-wide rules: backend-class and no-xpu-forward from the class hierarchy,
and the callers of a private helper across the import graph.

- **The hierarchy** is the tree's own: each class's bases, resolved through the
  imports and re-exports of its module, give its ancestors (left to right).
- **The backend XPU runs** is computed, not listed: the classes the factories
  registered under `intel_xpu` and `triton` (`@register_attention_backend`) build.
  XPU runs intel_xpu when a user names it, triton by default.
- **backend-class**: a class test (`isinstance`, `type(x) is`, a class name, a
  backend name) about attention backends that triton's class passes and
  intel_xpu's does not, with no XPU arm beside it: with intel_xpu the behaviour
  chosen for triton is skipped.
- **no-xpu-forward**: a class whose `forward_xpu` (its own or inherited) ends, maybe
  through `return self.forward_native(...)`, in a method that only raises
  NotImplementedError, although it has a platform forward of its own; each place
  that builds it is a finding.
- **Callers across modules**: a private helper found "used only by guarded code in
  this module" stays so only while no module an XPU server imports uses it
  unguarded; what rested on a helper taken back is taken back too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from functools import cache

from xpu_series.audit.scan import FileScan
from xpu_series.audit.scan_records import (
    BACKEND_CLASS,
    NO_XPU_FORWARD,
    ClassFact,
    ClassUse,
    RawFinding,
)

ATTENTION = "register_attention_backend"
XPU_BACKEND, DEFAULT_BACKEND = "intel_xpu", "triton"
_QUIET = "is used only by guarded code in this module"
_OTHER_FORWARDS = ("forward_cuda", "forward_hip", "forward_npu", "forward_musa")


class Hierarchy:
    """Every class of the tree, by its dotted name, and what resolves to it."""

    def __init__(self, scans: Mapping[str, FileScan]) -> None:
        self.classes: dict[str, tuple[str, ClassFact]] = {}
        self.bindings: dict[str, dict[str, str]] = {}
        for path, scan in scans.items():
            self.bindings[scan.module] = scan.bindings
            for fact in scan.classes:
                self.classes[f"{scan.module}.{fact.name}"] = (path, fact)
        self.mro = cache(self._mro)

    def resolve(self, name: str) -> str:
        """The class a dotted name means (through re-exports), or ""."""
        for _hop in range(8):
            if name in self.classes:
                return name
            module, _, attr = name.rpartition(".")
            target = self.bindings.get(module, {}).get(attr)
            if not target or target == name:
                return ""
            name = target
        return ""

    def _mro(self, key: str) -> tuple[str, ...]:
        out = [key]
        _path, fact = self.classes[key]
        for base in fact.bases:
            parent = self.resolve(base)
            if parent and parent != key:
                out.extend(k for k in self.mro(parent) if k not in out)
        return tuple(out)

    def method(self, key: str, name: str) -> tuple[str, str]:
        """(the class that defines `name` for `key`, what it does) or ("", "")."""
        for owner in self.mro(key):
            kind = self.classes[owner][1].methods.get(name)
            if kind is not None:
                return owner, kind
        return "", ""

    def short(self, key: str) -> str:
        return key.rsplit(".", 1)[-1]


def _registered(scans: Mapping[str, FileScan], tree: Hierarchy) -> dict[str, set[str]]:
    """Attention backend name -> the classes its registered factory builds."""
    out: dict[str, set[str]] = {}
    for scan in scans.values():
        for family, backend, factory in scan.registrations:
            if family != ATTENTION:
                continue
            built = {
                key
                for use in scan.uses
                if use.how == "build"
                and (use.function == factory or use.function.startswith(factory + "."))
                for name in use.names
                if (key := tree.resolve(name))
            }
            out.setdefault(backend, set()).update(built)
    return out


def backend_findings(
    scans: Mapping[str, FileScan], tree: Hierarchy
) -> dict[str, list[RawFinding]]:
    """`backend-class` findings by path."""
    registered = _registered(scans, tree)
    xpu = registered.get(XPU_BACKEND, set())
    default = registered.get(DEFAULT_BACKEND, set())
    if not xpu or not default:
        return {}
    every = [k for keys in registered.values() for k in keys]
    common = set.intersection(*(set(tree.mro(k)) for k in every)) if every else set()

    def names(keys: set[str]) -> set[str]:
        return {tree.short(k) for r in keys for k in tree.mro(r)}

    def passes(keys: set[str], tested: set[str]) -> bool:
        return any(t in tree.mro(r) for r in keys for t in tested)

    xpu_text = "/".join(sorted(tree.short(k) for k in xpu))
    default_text = "/".join(sorted(tree.short(k) for k in default))
    out: dict[str, list[RawFinding]] = {}
    for path, scan in scans.items():
        for use in scan.uses:
            if use.sibling or use.how == "build":
                continue
            if use.how == "isinstance":
                tested = {k for n in use.names if (k := tree.resolve(n))}
                related = any(set(tree.mro(k)) & common for k in tested)
                hit = related and passes(default, tested) and not passes(xpu, tested)
            elif use.how == "classname":
                tested_names = set(use.names)
                hit = bool(tested_names & names(default)) and not (
                    tested_names & names(xpu)
                )
            else:
                hit = DEFAULT_BACKEND in use.names and XPU_BACKEND not in use.names
            if not hit:
                continue
            label = ",".join(sorted(n.rsplit(".", 1)[-1] for n in use.names))
            then = (
                "the chain's last else raises"
                if use.otherwise
                else "the behaviour chosen here is skipped"
            )
            out.setdefault(path, []).append(
                RawFinding(
                    use.line,
                    use.function,
                    f"{use.how}:{label}",
                    BACKEND_CLASS,
                    use.guard,
                    "raises" if use.otherwise else "feature-off",
                    f"XPU runs {default_text} ({DEFAULT_BACKEND}, its default) or "
                    f"{xpu_text} (--attention-backend {XPU_BACKEND}); this test "
                    f"on {label} passes for the first and not the second, and no "
                    f"arm beside it handles XPU: with {XPU_BACKEND} {then}",
                )
            )
    return out


def lacks_xpu_forward(tree: Hierarchy, key: str) -> str:
    """Why XPU's dispatch of class `key` raises, or ""."""
    owner, kind = tree.method(key, "forward_xpu")
    chain = [f"{tree.short(owner)}.forward_xpu"] if owner else []
    for _hop in range(4):
        if not kind.startswith("to:"):
            break
        target = kind.removeprefix("to:")
        owner, kind = tree.method(key, target)
        chain.append(f"{tree.short(owner)}.{target}" if owner else target)
    if kind != "raises":
        return ""
    own = [
        name
        for cls in tree.mro(key)
        if cls != owner
        for name, what in tree.classes[cls][1].methods.items()
        if name in _OTHER_FORWARDS and what == "body"
    ]
    if not own:
        return ""  # no platform runs it: not an XPU gap
    return (
        f"{tree.short(key)} defines {', '.join(sorted(set(own)))} but neither "
        "forward_xpu nor forward_native; XPU's dispatch calls "
        f"{' -> '.join(chain)}, which raises NotImplementedError at the first "
        "forward"
    )


def forward_findings(
    scans: Mapping[str, FileScan], tree: Hierarchy
) -> dict[str, list[RawFinding]]:
    """`no-xpu-forward` findings by path: each place that builds such a class."""
    lacking: dict[str, str] = {}
    out: dict[str, list[RawFinding]] = {}
    for path, scan in scans.items():
        for use in scan.uses:
            if use.how != "build":
                continue
            for name in use.names:
                key = tree.resolve(name)
                if not key:
                    continue
                if key not in lacking:
                    lacking[key] = lacks_xpu_forward(tree, key)
                if lacking[key]:
                    where = tree.classes[key][0].removeprefix("python/")
                    out.setdefault(path, []).append(
                        _build_finding(use, key, where, lacking[key], tree)
                    )
    return out


def _build_finding(
    use: ClassUse, key: str, where: str, why: str, tree: Hierarchy
) -> RawFinding:
    return RawFinding(
        use.line,
        use.function,
        f"forward:{tree.short(key)}",
        NO_XPU_FORWARD,
        use.guard,
        "raises",
        f"{why} ({where})",
    )


def callers_elsewhere(
    scans: Mapping[str, FileScan], reached: set[str]
) -> dict[str, set[str]]:
    """Per path: the quiet functions whose reason does not hold, because a module
    an XPU server imports uses them unguarded (and what rested on those)."""
    used: set[tuple[str, str]] = {
        (module, name)
        for scan in scans.values()
        if scan.module in reached
        for module, name, guarded in scan.private_imports
        if not guarded
    }
    out: dict[str, set[str]] = {}
    for path, scan in scans.items():
        if not scan.quiet:
            continue
        taken = {
            qual
            for qual in scan.quiet
            if "." not in qual and (scan.module, qual) in used
        }
        changed = bool(taken)
        while changed:
            changed = False
            for qual, users in scan.quiet.items():
                if qual in taken:
                    continue
                if any(u == t or u.startswith(t + ".") for u in users for t in taken):
                    taken.add(qual)
                    changed = True
        if taken:
            out[path] = taken
    return out


def unquiet(findings: list[RawFinding], taken: set[str]) -> list[RawFinding]:
    """Findings in a function taken back lose the guard that rested on it."""
    out = []
    for raw in findings:
        if raw.guard.endswith(_QUIET):
            owner = next(
                (
                    t
                    for t in taken
                    if raw.function == t or raw.function.startswith(t + ".")
                ),
                "",
            )
            if owner:
                raw = dataclasses.replace(raw, guard="")
        out.append(raw)
    return out
