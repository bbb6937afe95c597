"""A rebase plan: the maintainer's decisions about patches, made before or during a
rebase (git's editable todo list), and what a finished rebase records of them.

One line per decision; patches not named are picked (carried as they apply):

    # comments and blank lines are ignored
    retire 0004-xpu-host-pool-rejection.patch 0.5.23 upstream binds XPU movers
    drop 0006 the PP fix went upstream another way

`retire NAME SINCE REASON`: upstream has the patch's behaviour from release SINCE
(the patch goes to patches/upstreamed/ with `Applied-Upstream: SINCE`).
`drop NAME REASON`: the patch is no longer wanted (patches/dropped/).
`edit NAME`: stop after the patch is carried, so its commit can be amended
(git's `edit`); `--continue` takes the amended commit.
NAME is a series entry, or its number (`0004`).
"""

from __future__ import annotations

from dataclasses import dataclass

from xpu_series.errors import UsageError
from xpu_series.stack.pin import version_tuple

ACTIONS = ("retire", "drop", "edit")


@dataclass(frozen=True)
class Decision:
    """What the maintainer decided for one patch."""

    action: str
    name: str
    reason: str
    since: str = ""

    def line(self) -> str:
        since = f" {self.since}" if self.action == "retire" else ""
        return f"{self.action} {self.name}{since} {self.reason}".rstrip()

    def to_json(self) -> dict[str, str]:
        return {
            "action": self.action,
            "name": self.name,
            "reason": self.reason,
            "since": self.since,
        }


def _resolve_name(word: str, names: list[str], where: str) -> str:
    if word in names:
        return word
    matches = [n for n in names if n.split("-", 1)[0] == word]
    if len(matches) == 1:
        return matches[0]
    raise UsageError(
        f"{where}: {word!r} is not a patch of the series",
        hint="name a series entry (e.g. "
        + (names[0] if names else "0001-x.patch")
        + ") or its number",
    )


def parse_plan(text: str, names: list[str], onto: str, source: str) -> list[Decision]:
    """The decisions of a plan file, checked against the series and the target.

    >>> plan = "retire 0002 0.5.21 upstream has it\\n# note\\ndrop b.patch unused\\n"
    >>> [d.line() for d in parse_plan(plan, ["0002-a.patch", "b.patch"], "0.5.23",
    ...                               "plan")]
    ['retire 0002-a.patch 0.5.21 upstream has it', 'drop b.patch unused']
    """
    decisions: list[Decision] = []
    seen: set[str] = set()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source}:{number}"
        words = line.split()
        action = words[0]
        if action == "edit" and len(words) == 2:
            name = _resolve_name(words[1], names, where)
            if name in seen:
                raise UsageError(f"{where}: {name} is decided twice")
            seen.add(name)
            decisions.append(Decision("edit", name, ""))
            continue
        if action == "pick":
            _resolve_name(words[1] if len(words) > 1 else "", names, where)
            continue
        if action not in ACTIONS:
            raise UsageError(
                f"{where}: unknown action {action!r}",
                hint="use 'retire NAME SINCE REASON', 'drop NAME REASON', "
                "'edit NAME' or 'pick NAME'",
            )
        need = 4 if action == "retire" else 3
        if len(words) < need:
            form = "retire NAME SINCE REASON" if action == "retire" else (
                "drop NAME REASON")  # fmt: skip
            raise UsageError(f"{where}: {action} needs a reason: '{form}'")
        name = _resolve_name(words[1], names, where)
        if name in seen:
            raise UsageError(f"{where}: {name} is decided twice")
        seen.add(name)
        since = ""
        rest = words[2:]
        if action == "retire":
            since, rest = rest[0], rest[1:]
            check_since(since, onto, where)
        decisions.append(Decision(action, name, " ".join(rest), since))
    return decisions


def check_since(since: str, onto: str, where: str) -> None:
    """A retirement's release must be a version at or below the target."""
    have, want = version_tuple(since), version_tuple(onto)
    if have is None:
        raise UsageError(f"{where}: {since!r} is not a release version (e.g. 0.5.21)")
    if want is not None and have > want:
        raise UsageError(
            f"{where}: upstream cannot have it from {since}: the rebase goes "
            f"onto {onto}",
            hint="retire it on a rebase onto that release or later",
        )


def render_plan(decisions: list[Decision], old: str, new: str) -> str:
    """The plan a finished rebase records (patches/moves/OLD-to-NEW.plan)."""
    head = [
        f"# xpu-series rebase plan: sglang {old} -> {new}",
        "# Written by 'xpu-series rebase'; replay with "
        f"'xpu-series rebase --onto {new} --plan THIS_FILE'.",
    ]
    return "\n".join([*head, *(d.line() for d in decisions)]) + "\n"
