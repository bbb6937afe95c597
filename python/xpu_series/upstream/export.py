"""Export carried patches as an upstream pull request: one commit per patch in
upstream's layout (code plus self-contained tests), numbered revisions under
build/upstream/ (one patch, or a bundle of several as one feature)."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xpu_series.errors import TreeError, UsageError
from xpu_series.git import Git
from xpu_series.project import Project
from xpu_series.result import ExitCode
from xpu_series.stack.header import PatchHeader, parse_header
from xpu_series.stack.series import Patch
from xpu_series.stack.tree import UPSTREAM_TAG, read_record
from xpu_series.upstream.lint import added_lines, format_files
from xpu_series.upstream.tests import ExportedTest, ExportError, export_test

if TYPE_CHECKING:
    from xpu_series.upstream.bundle import Bundle

# Why a Tests: class that is not in Fast-Tests stays out of upstream's unit/.
SERVER_REASON = "starts real servers; upstream's test/registered/unit/ starts none"
# Downstream bookkeeping that stays out of the exported commit message.
_FIELD_LINE = re.compile(r"^(Upstream-Status|Origin|Concern|Tests|Fast-Tests|"
                         r"Forwarded|Applied-Upstream|Applies-From):")  # fmt: skip
_FORMAT = ("format-patch", "-k", "--zero-commit", "--no-signature",
           "--full-index", "--stat=72")  # fmt: skip
# The exported patch files of a revision: 0001-<subject>.patch, one per commit.
PATCH_GLOB = "[0-9][0-9][0-9][0-9]-*.patch"
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
class Part:
    """One carried patch of an export: its commit's code and tests."""

    target: Target
    code: list[str] = field(default_factory=list)
    # Test files this commit adds (a file two patches name ships once).
    tests: list[ExportedTest] = field(default_factory=list)
    # Every exported test file of its Tests:, including one an earlier part added.
    test_paths: list[str] = field(default_factory=list)
    # Tests: files that stay home (real-server tests), with why.
    left_out: list[str] = field(default_factory=list)


@dataclass
class Export:
    """One revision of an export, as written under build/upstream/: a single
    patch, or a bundle of several (one commit each, one pull request)."""

    parts: list[Part]
    folder: Path  # build/upstream/<stem or bundle>/v<N>
    revision: int
    new: bool  # False: the content equals the previous revision's
    patch_files: list[Path]
    base: str  # the commit the export applies to (pristine, plus dependencies)
    bundle: Bundle | None = None
    depends: list[str] = field(default_factory=list)
    # Where the code change lands: `file: Class.function` (or `file: module`).
    functions: list[str] = field(default_factory=list)
    # Earlier carried patches that change the same files (not built on).
    neighbours: list[str] = field(default_factory=list)
    # The branch in build/upstream/.work that holds the pull request's commits.
    branch: str = ""

    @property
    def name(self) -> str:
        """The bundle's name, or the patch's stem."""
        return self.bundle.name if self.bundle else self.parts[0].target.stem

    @property
    def targets(self) -> list[Target]:
        return [part.target for part in self.parts]

    @property
    def code(self) -> list[str]:
        return sorted({path for part in self.parts for path in part.code})

    @property
    def tests(self) -> list[ExportedTest]:
        return [test for part in self.parts for test in part.tests]

    @property
    def left_out(self) -> list[str]:
        return list(dict.fromkeys(p for part in self.parts for p in part.left_out))

    @property
    def test_paths(self) -> list[str]:
        return [t.path for t in self.tests]

    @property
    def data_paths(self) -> list[str]:
        return [p for t in self.tests for p, _data in t.data]

    @property
    def patch_file(self) -> Path:
        return self.patch_files[0]

    def meta(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        if self.bundle is None:
            data["patch"] = self.parts[0].target.patch.name
        else:
            data["bundle"] = self.bundle.name
        return data | {
            "patches": [t.patch.name for t in self.targets],
            "revision": self.revision,
            "base": self.base,
            "depends": self.depends,
            "code": self.code,
            "tests": self.test_paths,
            "tests_of": {p.target.patch.name: p.test_paths for p in self.parts},
            "data": self.data_paths,
            "inlined": {t.path: [list(i) for i in t.inlined] for t in self.tests},
            "dropped": {t.path: t.dropped for t in self.tests},
            "functions": self.functions,
            "left_out": self.left_out,
            "neighbours": self.neighbours,
            "branch": self.branch,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            **self.meta(),
            "folder": str(self.folder),
            "patch_file": str(self.patch_file),
            "patch_files": [str(p) for p in self.patch_files],
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
                # Linked, or copied across filesystems (not `--local`).
                "clone", "-q", "--no-checkout", str(self.tree),
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


def _applies_in_turn(work: Workspace, base: str, shas: list[str]) -> bool:
    """Whether the commits apply one after another onto `base`; the work tree
    is left at `base` either way."""
    git = work.git
    work.reset(base)
    ok = True
    for sha in shas:
        if not _applies(git, sha):
            ok = False
            break
        _apply(git, sha)
    work.reset(base)
    return ok


def build_base(
    work: Workspace, targets: list[Target], series: list[tuple[str, str]]
) -> tuple[str, list[str]]:
    """The commit the export applies to: pristine upstream, plus the earlier
    patches whose files it touches when it does not apply on its own (a stacked
    pull request). `series`: (name, commit) of the carried patches below the
    export that are not part of it."""
    git = work.git
    shas = [t.commit for t in targets]
    if _applies_in_turn(work, UPSTREAM_TAG, shas):
        return git.out("rev-parse", "HEAD"), []
    files = set().union(*(_files_of(git, sha) for sha in shas))
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
    base = git.out("rev-parse", "HEAD")
    if needed and _applies_in_turn(work, base, shas):
        return base, [n for n, _s in needed]
    names = ", ".join(t.patch.name for t in targets)
    verb = "does" if len(targets) == 1 else "do"
    with_what = "even with " + ", ".join(n for n, _s in needed) if needed else "alone"
    raise ExportConflict(
        f"{names} {verb} not apply to pristine upstream {with_what}",
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
    return export_targets(project, tree, [find_target(project, tree, word)])


def export_bundle(project: Project, tree: Path, bundle: Bundle) -> Export:
    """Write (or find unchanged) the export of a bundle: its patches' commits in
    series order on one branch, as one pull request."""
    targets = [find_target(project, tree, name) for name in bundle.patches]
    return export_targets(project, tree, targets, bundle)


def export_targets(
    project: Project, tree: Path, targets: list[Target], bundle: Bundle | None = None
) -> Export:
    """One commit per target onto the base, then the revision under
    build/upstream/<name>/."""
    work = Workspace(project, tree)
    work.sync()
    source = Git(tree)
    carried = project.series().patches
    ours = {t.patch.name for t in targets}
    before = []
    commits = source.out("rev-list", "--reverse", f"{UPSTREAM_TAG}..HEAD").split()
    for patch in carried[: max(t.index for t in targets) - 1]:
        sha = _commit_of(source, patch, commits) if patch.name not in ours else ""
        if sha:
            before.append((patch.name, sha))
    base, depends = build_base(work, targets, before)
    git = work.git
    parts: list[Part] = []
    for target in targets:
        parts.append(_commit_part(project, work, source, target, parts))
    name = bundle.name if bundle else targets[0].stem
    folder = project.build_dir / "upstream" / name
    staging = folder / ".new"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    listed = git.out(*_FORMAT, "-o", str(staging), f"{base}..HEAD").splitlines()
    made = [Path(n) if Path(n).is_absolute() else work.root / n for n in listed]
    have = revisions(folder)
    previous = folder / f"v{have[-1]}" if have else None
    same = previous is not None and _same_patches(previous, made)
    if same:
        assert previous is not None
        shutil.rmtree(staging)
        revision, out = have[-1], previous
    else:
        revision = (have[-1] if have else 0) + 1
        out = folder / f"v{revision}"
        os.replace(staging, out)
    code = sorted({p for part in parts for p in part.code})
    neighbours = [
        below
        for below, sha in before
        if below not in depends and _files_of(git, sha) & set(code)
    ]
    # The pull request's branch, for pushing from the work clone.
    branch = f"pr/{name}"
    git.run("branch", "-f", branch, "HEAD")
    export = Export(parts, out, revision, not same,
                    [out / m.name for m in made], base, bundle, depends,
                    changed_functions(git, base, code), neighbours,
                    branch)  # fmt: skip
    (out / "export.json").write_text(
        json.dumps(export.meta(), indent=2, sort_keys=True) + "\n"
    )
    return export


def _commit_part(
    project: Project, work: Workspace, source: Git, target: Target,
    parts_done: list[Part],
) -> Part:  # fmt: skip
    """Apply the target's code and add its tests, formatted, as one commit."""
    git = work.git
    _apply(git, target.commit)
    part = Part(target, sorted(_files_of(git, target.commit)))
    tests, part.left_out = make_tests(project, target.header)
    shipped = {path for done in parts_done for path in done.test_paths}
    written = []
    for test in tests:
        part.test_paths.append(test.path)
        if test.path in shipped:
            continue  # an earlier commit of the bundle added the same file
        part.tests.append(test)
        for rel, data in [(test.path, test.text.encode()), *test.data]:
            dest = work.root / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
            written.append(rel)
    if written:
        format_files(work.root, written, project.cache_dir)
        git.run("add", "--", *written)
    for test in part.tests:
        test.text = (work.root / test.path).read_text(encoding="utf-8")
    work.commit(commit_message(target.header), _author(source, target.commit))
    return part


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


def _same_patches(previous: Path, made: list[Path]) -> bool:
    old = sorted(previous.glob(PATCH_GLOB))
    return [p.name for p in old] == [p.name for p in made] and all(
        a.read_bytes() == b.read_bytes() for a, b in zip(old, made, strict=True)
    )


def _commit_of(git: Git, patch: Patch, commits: list[str]) -> str:
    want = _patch_id(git, patch.text)
    for sha in commits:
        if _patch_id(git, git.run("show", "--format=", sha).stdout) == want:
            return sha
    return ""
