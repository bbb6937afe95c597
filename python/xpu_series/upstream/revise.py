"""Between revisions of an export (a range-diff, as b4's --compare-to), and the
pull request recorded back in the patch header (DEP-3 `Forwarded:`)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from xpu_series.errors import UsageError, XpuSeriesError
from xpu_series.git import run_command
from xpu_series.project import Project
from xpu_series.stack.operation import require_idle
from xpu_series.stack.tree import read_record, write_record
from xpu_series.upstream.export import (
    PATCH_GLOB,
    Export,
    Target,
    Workspace,
    revisions,
    tree_git,
)

# A pull request's address: http(s), a host with a dot, a path, no spaces.
_URL = re.compile(r"^https?://[A-Za-z0-9.-]+\.[A-Za-z]{2,}(:[0-9]+)?/[^\s<>\"']+$")
_FORWARDED = re.compile(r"^Forwarded:.*$", re.M)


def check_url(url: str) -> str:
    """The URL, or a usage error when it is not an http(s) address of a page.

    >>> check_url("https://github.com/sgl-project/sglang/pull/12345")
    'https://github.com/sgl-project/sglang/pull/12345'
    """
    if not _URL.match(url):
        raise UsageError(
            f"--forwarded {url!r} is not the address of a pull request",
            hint="pass its full URL, e.g. "
            "https://github.com/sgl-project/sglang/pull/12345",
        )
    return url


def _patches_of(folder: Path) -> list[Path]:
    found = sorted(folder.glob(PATCH_GLOB))
    if not found:
        raise XpuSeriesError(
            f"{folder} holds no exported patch",
            hint="remove the folder and export again",
        )
    return found


def range_diff(
    project: Project, export: Export, old: int, tree: Path
) -> tuple[Path, str]:
    """`git range-diff` of revision `old` against the export's; written beside
    the revisions and returned."""
    folder = export.folder.parent
    have = revisions(folder)
    if old not in have:
        raise UsageError(
            f"{export.name} has no revision v{old} "
            f"(it has {', '.join(f'v{n}' for n in have)})",
            hint="name one of those with --compare-to",
        )
    work = Workspace(project, tree)
    git = work.git
    ranges = []
    for number in (old, export.revision):
        meta_path = folder / f"v{number}" / "export.json"
        try:
            base = json.loads(meta_path.read_text())["base"]
        except (OSError, ValueError, KeyError):
            base = export.base
        if git.rev(base) is None:
            base = export.base
        work.reset(base)
        start = git.out("rev-parse", "HEAD")
        files = [str(p) for p in _patches_of(folder / f"v{number}")]
        applied = git.run("am", "-q", "-k", *files, check=False)
        if not applied.ok:
            git.run("am", "--abort", check=False)
            raise XpuSeriesError(
                f"v{number} of {export.name} no longer applies to its base",
                hint="compare the patch files by hand (diff -u)",
            )
        ranges.append(f"{start}..{git.out('rev-parse', 'HEAD')}")
    text = git.run("range-diff", "--no-color", *ranges).stdout
    out = folder / f"range-diff-v{old}-v{export.revision}.txt"
    out.write_text(text)
    return out, text


def with_forwarded(message: str, url: str) -> str:
    """The commit message with `Forwarded: url` (replacing one, or after the
    Upstream-Status line, or at the end of the fields).

    >>> text = "S\\n\\nWhy.\\n\\nUpstream-Status: Pending\\nTests: t.py\\n"
    >>> with_forwarded(text, "https://x.org/p/1").splitlines()[-3:]
    ['Upstream-Status: Pending', 'Forwarded: https://x.org/p/1', 'Tests: t.py']
    """
    line = f"Forwarded: {url}"
    if _FORWARDED.search(message):
        return _FORWARDED.sub(line, message, count=1)
    lines = message.rstrip("\n").split("\n")
    for i, text in enumerate(lines):
        if text.startswith("Upstream-Status:"):
            lines.insert(i + 1, line)
            return "\n".join(lines) + "\n"
    return "\n".join([*lines, line]) + "\n"


def record_forwarded(project: Project, tree: Path, target: Target, url: str) -> bool:
    """Put `Forwarded: url` in the patch's commit in the tree (the commits above
    it keep their trees and messages), then regenerate patches/ with refresh.
    False when the header already says so."""
    require_idle(project.operations, "upstream --forwarded")
    git = tree_git(tree)
    message = git.run("log", "-1", "--format=%B", target.commit).stdout
    message = message.rstrip("\n") + "\n"
    new_message = with_forwarded(message, url)
    if new_message == message:
        return False
    chain = git.out("rev-list", "--reverse", f"{target.commit}^..HEAD").split()
    prev = git.out("rev-parse", f"{target.commit}^")
    renamed: dict[str, str] = {}
    for sha in chain:
        fields = git.out(
            "log", "-1", "--format=%an%x00%ae%x00%aI%x00%cn%x00%ce%x00%cI", sha
        ).split("\0")
        env = dict(zip(
            ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_AUTHOR_DATE",
             "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "GIT_COMMITTER_DATE"),
            fields, strict=True,
        ))  # fmt: skip
        text = (
            new_message
            if sha == target.commit
            else git.run("log", "-1", "--format=%B", sha).stdout.rstrip("\n") + "\n"
        )
        prev = git.run(
            "commit-tree", f"{sha}^{{tree}}", "-p", prev, "-F", "-",
            env=env, input_text=text,
        ).stdout.strip()  # fmt: skip
        renamed[sha] = prev
    # Same trees: the index and the files stay as they are.
    git.run("reset", "-q", "--soft", prev)
    record = read_record(git)
    for entry in record.get("applied", []):
        if entry.get("commit") in renamed:
            entry["commit"] = renamed[entry["commit"]]
    write_record(git, record)
    _refresh(project, tree)
    return True


def _refresh(project: Project, tree: Path) -> None:
    """`xpu-series refresh`, the one writer of patches/ (a verb of its own)."""
    ran = run_command(
        [sys.executable, "-m", "xpu_series", "-C", str(project.root), "refresh",
         "--tree", str(tree)],
    )  # fmt: skip
    if not ran.ok:
        raise XpuSeriesError(
            "the tree has the Forwarded line but refresh failed: "
            + (ran.stderr or ran.stdout).strip().splitlines()[-1:][0],
            hint="run 'xpu-series refresh' and read its error",
        )
