"""Export one carried patch as an upstream pull request: one commit in upstream's
layout (code plus self-contained tests), numbered revisions under build/upstream/."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpu_series.errors import TreeError, UsageError
from xpu_series.git import Git
from xpu_series.project import Project
from xpu_series.result import ExitCode
from xpu_series.stack.header import PatchHeader, parse_header
from xpu_series.stack.series import Patch
from xpu_series.stack.tree import UPSTREAM_TAG, read_record
from xpu_series.upstream.lint import added_lines, format_files
from xpu_series.upstream.tests import ExportedTest, ExportError, export_test

# Why a Tests: class that is not in Fast-Tests stays out of upstream's unit/.
SERVER_REASON = "starts real servers; upstream's test/registered/unit/ starts none"
# Downstream bookkeeping that stays out of the exported commit message.
_FIELD_LINE = re.compile(r"^(Upstream-Status|Origin|Concern|Tests|Fast-Tests|"
                         r"Forwarded|Applied-Upstream|Applies-From):")  # fmt: skip
_FORMAT = ("format-patch", "-1", "-k", "--zero-commit", "--no-signature",
           "--full-index", "--stat=72")  # fmt: skip
_REF = "refs/xpu-series/tree-head"


class ExportConflict(ExportError):
    """The patch does not apply to upstream on its own nor with what it needs."""

    exit_code = ExitCode.CONFLICT


@dataclass(frozen=True)
class Target:
    """The carried patch to export and its commit in the tree."""

    index: int  # 1-based position in the series
    patch: Patch
    commit: str
    header: PatchHeader

    @property
    def stem(self) -> str:
        return self.patch.name.removesuffix(".patch")


@dataclass
class Export:
    """One revision of a patch's export, as written under build/upstream/."""

    target: Target
    folder: Path  # build/upstream/<stem>/v<N>
    revision: int
    new: bool  # False: the content equals the previous revision's
    patch_file: Path
    base: str  # the commit the export applies to (pristine, plus dependencies)
    depends: list[str] = field(default_factory=list)
    code: list[str] = field(default_factory=list)
    tests: list[ExportedTest] = field(default_factory=list)
    # Where the code change lands: `file: Class.function` (or `file: module`).
    functions: list[str] = field(default_factory=list)
    # Tests: files that stay home (real-server tests), with why.
    left_out: list[str] = field(default_factory=list)
    # Earlier carried patches that change the same files (not built on).
    neighbours: list[str] = field(default_factory=list)

    @property
    def test_paths(self) -> list[str]:
        return [t.path for t in self.tests]

    @property
    def data_paths(self) -> list[str]:
        return [p for t in self.tests for p, _data in t.data]

    def meta(self) -> dict[str, Any]:
        return {
            "patch": self.target.patch.name,
            "revision": self.revision,
            "base": self.base,
            "depends": self.depends,
            "code": self.code,
            "tests": self.test_paths,
            "data": self.data_paths,
            "inlined": {t.path: [list(i) for i in t.inlined] for t in self.tests},
            "dropped": {t.path: t.dropped for t in self.tests},
            "functions": self.functions,
            "left_out": self.left_out,
            "neighbours": self.neighbours,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            **self.meta(),
            "folder": str(self.folder),
            "patch_file": str(self.patch_file),
            "new": self.new,
        }


def exportable(project: Project) -> list[str]:
    return [p.name.removesuffix(".patch") for p in project.series().patches]


def resolve(project: Project, word: str) -> tuple[int, Patch]:
    """The carried patch `word` names (file name, stem or number)."""
    carried = project.series().patches
    for i, patch in enumerate(carried, start=1):
        name = patch.name
        if word in (name, name.removesuffix(".patch"), name[:4]) or (
            word.isdigit() and name[:4].isdigit() and int(word) == int(name[:4])
        ):
            return i, patch
    can = ", ".join(exportable(project)) or "none"
    for folder in ("upstreamed", "dropped"):
        for path in sorted((project.patches_dir / folder).glob("*.patch")):
            if word in (path.name, path.stem, path.name[:4]) or (
                word.isdigit() and int(word) == int(path.name[:4])
            ):
                raise UsageError(
                    f"{path.name} is retired (patches/{folder}/): there is nothing "
                    f"to send upstream; exportable: {can}",
                    hint="name a carried patch (as in patches/series)",
                )
    raise UsageError(
        f"no carried patch is called {word!r}; exportable: {can}",
        hint="name a patch as in patches/series, its stem, or its number",
    )


def require_tests(project: Project, patch: Patch, header: PatchHeader) -> None:
    """Refuse a patch without tests, or whose Tests: name missing files."""
    if not header.tests:
        raise ExportError(
            f"{patch.name} names no tests (no Tests: field): upstream takes no "
            "change without one",
            hint="add a test under test/registered/unit/ and a Tests: line to the "
            "commit message in the tree, then refresh",
        )
    missing = [
        t for t in header.tests if not (project.root / t.split("::")[0]).is_file()
    ]
    if missing:
        raise ExportError(
            f"{patch.name} names tests that do not exist: {', '.join(missing)}",
            hint="fix the Tests: field in the patch's commit message, then refresh",
        )


def tree_git(tree: Path) -> Git:
    """The series tree, which must be clean (an export is made from commits)."""
    git = Git(tree)
    if not git.is_repo() or git.rev(UPSTREAM_TAG) is None:
        raise TreeError(
            f"{tree} is not a tree made by 'xpu-series apply'",
            hint="run 'xpu-series apply' first",
        )
    dirty = git.dirty_paths()
    if dirty:
        raise TreeError(
            f"{tree} has uncommitted edits ({dirty[0].strip()}"
            f"{', ...' if len(dirty) > 1 else ''}); an export is made from "
            "commits",
            hint=f"commit them (git -C {tree} commit -a; a test follows them), "
            "run 'xpu-series refresh', then export again; or stash them",
        )
    return git


def _patch_id(git: Git, text: str) -> str:
    out = git.run("patch-id", "--stable", input_text=text).stdout.split()
    return out[0] if out else ""


def find_target(project: Project, tree: Path, word: str) -> Target:
    """The patch `word` names and its commit in the clean tree, which must carry
    exactly what patches/ holds for it."""
    index, patch = resolve(project, word)
    git = tree_git(tree)
    commits = git.out("rev-list", "--reverse", f"{UPSTREAM_TAG}..HEAD").split()
    recorded = {
        a.get("name"): a.get("commit") for a in read_record(git).get("applied", [])
    }
    want = _patch_id(git, patch.text)
    candidates = [recorded.get(patch.name)] + commits
    for sha in candidates:
        if sha and sha in commits:
            if _patch_id(git, git.run("show", "--format=", sha).stdout) == want:
                message = git.run("format-patch", "-1", "--stdout", "-k", sha).stdout
                header = parse_header(message)
                require_tests(project, patch, header)
                return Target(index, patch, sha, header)
    raise TreeError(
        f"no commit of {tree} carries what patches/{patch.name} holds",
        hint="bring the tree and patches/ together: 'xpu-series refresh' after "
        "committing in the tree, or 'xpu-series apply' to rebuild the tree",
    )


class Workspace:
    """build/upstream/.work: a clone of the tree's repository whose work tree
    every export and check reuses (pristine files stay, compiled once)."""

    def __init__(self, project: Project, tree: Path) -> None:
        self.project = project
        self.tree = tree
        self.root = project.build_dir / "upstream" / ".work"
        self.git = Git(self.root)

    def sync(self) -> None:
        if not self.git.is_repo():
            if self.root.exists():
                shutil.rmtree(self.root)
            self.root.parent.mkdir(parents=True, exist_ok=True)
            Git(self.root.parent).run(
                "clone", "-q", "--local", "--no-checkout", str(self.tree),
                str(self.root),
            )  # fmt: skip
            exclude = self.git.git_dir() / "info" / "exclude"
            exclude.parent.mkdir(parents=True, exist_ok=True)
            exclude.write_text("__pycache__/\n*.py[co]\n")
        self.git.run(
            "fetch", "-q", "--no-tags", str(self.tree), f"+HEAD:{_REF}",
            f"+refs/tags/{UPSTREAM_TAG}:refs/tags/{UPSTREAM_TAG}",
        )  # fmt: skip

    def reset(self, commit: str) -> None:
        """The work tree at `commit`, nothing else in it (compiled files stay)."""
        self.git.run("checkout", "-q", "-f", "--detach", commit)
        self.git.run("clean", "-q", "-f", "-d")

    def commit(self, message: str, author: tuple[str, str, str]) -> str:
        name, email, date = author
        env = {
            "GIT_AUTHOR_NAME": name,
            "GIT_AUTHOR_EMAIL": email,
            "GIT_AUTHOR_DATE": date,
            "GIT_COMMITTER_DATE": date,
        }
        self.git.run("commit", "-q", "--no-verify", "-m", message, env=env)
        return self.git.out("rev-parse", "HEAD")


def _author(git: Git, sha: str) -> tuple[str, str, str]:
    name, email, date = git.out("log", "-1", "--format=%an%x00%ae%x00%aI", sha).split(
        "\0"
    )
    return name, email, date


def _files_of(git: Git, sha: str) -> set[str]:
    return set(git.out("diff-tree", "--no-commit-id", "--name-only", "-r", sha).split())


def _applies(git: Git, sha: str) -> bool:
    diff = git.run("diff", "--binary", "--full-index", f"{sha}^", sha).stdout
    return git.run("apply", "--check", "--index", "-", input_text=diff, check=False).ok


def _apply(git: Git, sha: str) -> None:
    diff = git.run("diff", "--binary", "--full-index", f"{sha}^", sha).stdout
    git.run("apply", "--index", "-", input_text=diff)


def build_base(work: Workspace, target: Target, series: list[tuple[str, str]]) -> tuple[
    str, list[str]
]:  # fmt: skip
    """The commit the export applies to: pristine upstream, plus the earlier
    patches whose files it touches when it does not apply on its own (a stacked
    pull request). `series`: (name, commit) of the patches before the target."""
    git = work.git
    work.reset(UPSTREAM_TAG)
    if _applies(git, target.commit):
        return git.out("rev-parse", "HEAD"), []
    files = _files_of(git, target.commit)
    needed: list[tuple[str, str]] = []
    for name, sha in reversed(series):
        if _files_of(git, sha) & files:
            needed.insert(0, (name, sha))
            files |= _files_of(git, sha)
    for _name, sha in needed:
        if not _applies(git, sha):
            break
        _apply(git, sha)
        subject = git.out("log", "-1", "--format=%s", sha)
        work.commit(f"{subject}\n\n(the pull request this one builds on)\n", _author(
            git, sha))  # fmt: skip
    if needed and _applies(git, target.commit):
        return git.out("rev-parse", "HEAD"), [n for n, _s in needed]
    raise ExportConflict(
        f"{target.patch.name} does not apply to pristine upstream "
        f"{'even with ' + ', '.join(n for n, _s in needed) if needed else 'alone'}",
        hint="rebase the commit in the tree so it stands on upstream (or on the "
        "patches it names), then refresh and export again",
    )


def commit_message(header: PatchHeader) -> str:
    """The subject and description, without our DEP-3 bookkeeping."""
    body = [
        line for line in header.description.splitlines() if not _FIELD_LINE.match(line)
    ]
    text = "\n".join(body).strip()
    return f"{header.subject}\n\n{text}\n" if text else f"{header.subject}\n"


def make_tests(
    project: Project, header: PatchHeader
) -> tuple[list[ExportedTest], list[str]]:
    """Each Tests: file made self-contained, and the files left out. When the
    patch names Fast-Tests, only they go (the rest start real servers): a file
    it names whole, or the classes it names of a file."""
    files = list(dict.fromkeys(t.split("::")[0] for t in header.tests))
    fast = header.fast_tests if header.get("Fast-Tests") else []
    fast_files = {t.split("::")[0] for t in fast}
    out, left_out = [], []
    for rel in files:
        if fast and rel not in fast_files:
            left_out.append(f"{rel} ({SERVER_REASON})")
            continue
        classes = {t.split("::")[1] for t in fast if t.startswith(rel + "::")}
        out.append(export_test(project.root, rel, classes or None, SERVER_REASON))
    return out, left_out


def revisions(folder: Path) -> list[int]:
    return sorted(
        int(p.name[1:])
        for p in folder.glob("v*")
        if p.is_dir() and p.name[1:].isdigit()
    )


def export_patch(project: Project, tree: Path, word: str) -> Export:
    """Write (or find unchanged) the export of the patch `word` names."""
    target = find_target(project, tree, word)
    work = Workspace(project, tree)
    work.sync()
    source = Git(tree)
    carried = project.series().patches
    before = []
    commits = source.out("rev-list", "--reverse", f"{UPSTREAM_TAG}..HEAD").split()
    for patch in carried[: target.index - 1]:
        sha = _commit_of(source, patch, commits)
        if sha:
            before.append((patch.name, sha))
    base, depends = build_base(work, target, before)
    git = work.git
    _apply(git, target.commit)
    code = sorted(_files_of(git, target.commit))
    tests, left_out = make_tests(project, target.header)
    written = []
    for test in tests:
        for rel, data in [(test.path, test.text.encode()), *test.data]:
            dest = work.root / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
            written.append(rel)
    format_files(work.root, written, project.cache_dir)
    for test in tests:
        test.text = (work.root / test.path).read_text(encoding="utf-8")
    git.run("add", "--", *written)
    work.commit(commit_message(target.header), _author(source, target.commit))
    folder = project.build_dir / "upstream" / target.stem
    staging = folder / ".new"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    name = git.out(*_FORMAT, "-o", str(staging), "HEAD")
    made = Path(name) if Path(name).is_absolute() else work.root / name
    have = revisions(folder)
    previous = folder / f"v{have[-1]}" if have else None
    same = previous is not None and _same_patch(previous, made)
    if same:
        assert previous is not None
        shutil.rmtree(staging)
        revision, out = have[-1], previous
    else:
        revision = (have[-1] if have else 0) + 1
        out = folder / f"v{revision}"
        os.replace(staging, out)
    patch_file = out / made.name
    neighbours = [
        name
        for name, sha in before
        if name not in depends and _files_of(git, sha) & set(code)
    ]
    export = Export(target, out, revision, not same, patch_file, base, depends, code,
                    tests, changed_functions(git, base, code), left_out,
                    neighbours)  # fmt: skip
    (out / "export.json").write_text(
        json.dumps(export.meta(), indent=2, sort_keys=True) + "\n"
    )
    return export


def changed_functions(git: Git, base: str, paths: list[str]) -> list[str]:
    """`file: Class.function` for each function whose lines the change adds to
    (`file: module` for lines outside any function)."""
    diff = git.run("diff", "-U0", base, "HEAD", "--", *paths).stdout
    out: list[str] = []
    for path, lines in sorted(added_lines(diff).items()):
        if not path.endswith(".py"):
            continue
        tree = ast.parse((git.repo / path).read_text(encoding="utf-8"))
        spans = _function_spans(tree, "")
        for line in sorted(lines):
            inner = [s for s in spans if s[0] <= line <= s[1]]
            name = min(inner, key=lambda s: s[1] - s[0])[2] if inner else "module"
            label = f"{Path(path).name}: {name}"
            if label not in out:
                out.append(label)
    return out


def _function_spans(node: ast.AST, prefix: str) -> list[tuple[int, int, str]]:
    """(first line, last line, qualified name) of every function below `node`."""
    spans: list[tuple[int, int, str]] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef):
            spans += _function_spans(child, f"{prefix}{child.name}.")
        elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            name = f"{prefix}{child.name}"
            spans.append((child.lineno, child.end_lineno or child.lineno, name))
            spans += _function_spans(child, f"{name}.")
    return spans


def _same_patch(previous: Path, made: Path) -> bool:
    old = sorted(previous.glob("0001-*.patch"))
    return (
        len(old) == 1
        and old[0].name == made.name
        and (old[0].read_bytes() == made.read_bytes())
    )


def _commit_of(git: Git, patch: Patch, commits: list[str]) -> str:
    want = _patch_id(git, patch.text)
    for sha in commits:
        if _patch_id(git, git.run("show", "--format=", sha).stdout) == want:
            return sha
    return ""
