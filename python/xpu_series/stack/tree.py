"""Materialize the pristine upstream as a git tree, reusing a cached base."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from xpu_series.errors import TreeError
from xpu_series.git import Git, read_blobs
from xpu_series.stack.pin import Pin
from xpu_series.stack.wheel import FetchedWheel, wheel_files

UPSTREAM_TAG = "upstream"
BRANCH = "xpu"
APPLIED_REF = "refs/xpu-series/applied"
# Where a tree on another upstream keeps the pinned base, for `git am -3`.
PIN_BASE_REF = "refs/xpu-series/pin-base"
RECORD = "xpu-series.json"
# A fixed date makes the base commit id a function of the wheel's content alone.
_BASE_EPOCH = 946684800  # 2000-01-01T00:00:00Z
_WHO = b"xpu-series <xpu-series@localhost> %d +0000" % _BASE_EPOCH


@dataclass(frozen=True)
class BaseInfo:
    """The upstream commit a tree starts from, and where it came from."""

    commit: str
    version: str
    sha256: str
    source: str  # "cache", "unpacked" or "checkout"


def read_record(git: Git) -> dict:
    path = git.git_dir() / RECORD
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def write_record(git: Git, record: dict) -> None:
    path = git.git_dir() / RECORD
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _base_cache(cache: Path, digest: str) -> Path:
    return cache / "bases" / f"{digest}.git"


def _fast_import_stream(wheel: FetchedWheel, pin: Pin) -> Iterator[bytes]:
    """The wheel as one `git fast-import` commit on refs/tags/upstream.

    Streaming the blobs into a single pack avoids writing thousands of loose
    objects (the cost of `git add` on a slow filesystem) and never writes the
    files twice: the work tree is checked out from the pack afterwards.
    """
    entries: list[bytes] = []
    for mark, (path, executable, data) in enumerate(
        wheel_files(wheel.path, pin), start=1
    ):
        yield b"blob\nmark :%d\ndata %d\n" % (mark, len(data))
        yield data
        yield b"\n"
        mode = b"100755" if executable else b"100644"
        entries.append(b"M %s :%d %s\n" % (mode, mark, path.encode()))
    message = f"{pin.project} {wheel.version} (wheel sha256 {wheel.sha256})\n"
    yield b"commit refs/tags/%s\n" % UPSTREAM_TAG.encode()
    yield b"author %s\ncommitter %s\n" % (_WHO, _WHO)
    yield b"data %d\n%s\n" % (len(message.encode()), message.encode())
    yield from entries
    yield b"\n"


def borrow_blobs(git: Git, cache_repo: Path, wanted: set[str]) -> int:
    """Copy the blobs of `wanted` the base cache holds into `git`'s repository,
    kept as the tree of a commit at PIN_BASE_REF; how many. A 3-way `git am`
    reads only the blobs a patch names in its `index` lines: copying those, not
    the whole base (a pack of every file, made and indexed again per tree)."""
    listed = (
        Git(cache_repo)
        .run(
            "cat-file",
            "--batch-check",
            input_text="".join(f"{b}\n" for b in sorted(wanted)),
        )
        .stdout
    )
    found = [
        f[0]
        for f in (line.split() for line in listed.splitlines())
        if f[1:2] == ["blob"]
    ]
    if not found:
        return 0
    blobs = read_blobs(cache_repo, found)

    def stream() -> Iterator[bytes]:
        message = b"blobs of the pinned base that the patches apply to\n"
        yield b"commit %s\ncommitter %s\n" % (PIN_BASE_REF.encode(), _WHO)
        yield b"data %d\n%s\n" % (len(message), message)
        for blob, data in sorted(blobs.items()):
            yield b"M 100644 inline %s/%s\ndata %d\n" % (
                blob[:2].encode(),
                blob[2:].encode(),
                len(data),
            )
            yield data
            yield b"\n"
        yield b"\n"

    git.feed(["fast-import", "--quiet", "--force"], stream())
    return len(blobs)


def ensure_base_cache(wheel: FetchedWheel, pin: Pin, cache: Path) -> tuple[Path, bool]:
    """The bare repository holding the wheel's base commit; True if just built."""
    cache_repo = _base_cache(cache, wheel.sha256)
    if cache_repo.is_dir():
        return cache_repo, False
    cache_repo.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".base-", dir=cache_repo.parent) as tmp:
        staging = Path(tmp) / "base.git"
        Git(Path(tmp)).run("init", "-q", "--bare", str(staging))
        Git(staging).feed(
            ["-c", "pack.compression=1", "fast-import", "--quiet"],
            _fast_import_stream(wheel, pin),
        )
        if not cache_repo.exists():
            os.replace(staging, cache_repo)
    return cache_repo, True


def ignore_bytecode(git: Git) -> None:
    """Imports leave __pycache__ behind; they are not local edits (and
    `bytecode.prime` puts .pyc files only where they are ignored)."""
    exclude = git.git_dir() / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    exclude.write_text("__pycache__/\n*.py[co]\n")


def _configure(git: Git) -> None:
    ignore_bytecode(git)


def _is_empty_dir(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


def materialize_base(
    wheel: FetchedWheel, pin: Pin, tree: Path, cache: Path
) -> BaseInfo:
    """Put `tree` at the pristine upstream commit tagged `upstream` on branch `xpu`.

    The caller has already checked that an existing tree may be reset (clean, or
    its edits saved). Branches and stashes of an existing tree are kept.
    """
    git = Git(tree)
    is_repo = git.is_repo()
    if not is_repo and tree.exists() and not _is_empty_dir(tree):
        raise TreeError(
            f"{tree} exists and is not a git repository",
            hint="pass an empty or new --tree, or an upstream git checkout",
        )
    if (
        is_repo
        and git.rev(UPSTREAM_TAG)
        and read_record(git).get("sha256") == (wheel.sha256)
    ):
        source = "tree"
    else:
        cache_repo, built = ensure_base_cache(wheel, pin, cache)
        source = "unpacked" if built else "cache"
        if is_repo:
            # Another upstream lives here: bring the new base in beside it.
            git.run("fetch", "-q", str(cache_repo), f"+refs/tags/{UPSTREAM_TAG}:"
                    f"refs/tags/{UPSTREAM_TAG}")  # fmt: skip
        else:
            record = {"version": wheel.version, "sha256": wheel.sha256}
            commit = _build_beside(cache_repo, tree, record)
            return BaseInfo(commit, wheel.version, wheel.sha256, source)
    git.run("checkout", "-q", "-f", "-B", BRANCH, UPSTREAM_TAG)
    commit = git.out("rev-parse", UPSTREAM_TAG)
    record = read_record(git) if source == "tree" else {}
    record.update(version=wheel.version, sha256=wheel.sha256, base=commit)
    write_record(git, record)
    return BaseInfo(commit, wheel.version, wheel.sha256, source)


def partial_trees(tree: Path) -> list[Path]:
    """Trees an interrupted build left beside `tree` (never renamed into place)."""
    return sorted(tree.parent.glob(f".{tree.name}.partial-*"))


def _build_beside(cache_repo: Path, tree: Path, record: dict) -> str:
    """Clone and check out a new tree beside its final path, then rename it in.

    An interrupt at any moment leaves either no tree or a complete one; the
    half-made folder beside it is ours and the next build removes it.
    """
    for leftover in partial_trees(tree):
        shutil.rmtree(leftover, ignore_errors=True)
    staging = tree.parent / f".{tree.name}.partial-{os.getpid()}"
    tree.parent.mkdir(parents=True, exist_ok=True)
    # A clone from a path hard-links the pack (no copy of the objects), and
    # copies it where the tree is on another filesystem than the cache
    # (`--local` would fail there instead).
    Git(tree.parent).run("clone", "-q", "--no-checkout", str(cache_repo), str(staging))
    new = Git(staging)
    _configure(new)
    new.run("checkout", "-q", "-f", "-B", BRANCH, UPSTREAM_TAG)
    commit = new.out("rev-parse", UPSTREAM_TAG)
    # The record goes in before the rename: a tree without one is taken for a
    # user's own upstream checkout.
    write_record(new, {**record, "base": commit})
    if tree.exists():
        tree.rmdir()  # only an empty folder gets here
    os.replace(staging, tree)
    return commit


def repair(git: Git) -> list[str]:
    """Undo what an interrupted git command of ours left in a tree we own.

    Only called on trees the tool was building (scratch trees, or a tree whose
    operation state says it was interrupted): nothing in them is a user's edit.
    """
    notes: list[str] = []
    git_dir = git.repo / ".git"
    lock = git_dir / "index.lock"
    if lock.exists():
        lock.unlink()
        notes.append("removed the index.lock an interrupted git command left")
    if (git_dir / "rebase-apply").exists():
        git.run("am", "--abort", check=False)
        shutil.rmtree(git_dir / "rebase-apply", ignore_errors=True)
    git.run("reset", "-q", "--hard", check=False)
    return notes


def checkout_base(tree: Path) -> BaseInfo:
    """Use an upstream git checkout: its `upstream` tag, or HEAD, is the base."""
    git = Git(tree)
    commit = git.rev(UPSTREAM_TAG)
    if commit is None:
        commit = git.out("rev-parse", "HEAD")
        git.run("tag", UPSTREAM_TAG, commit)
    git.run("checkout", "-q", "-f", "-B", BRANCH, UPSTREAM_TAG)
    record = read_record(git)
    version = record.get("version", "checkout")
    write_record(
        git, {"version": version, "sha256": record.get("sha256", ""), "base": commit}
    )
    return BaseInfo(commit, version, record.get("sha256", ""), "checkout")


# Canonical export: no [PATCH] prefix, no real sha in the From line, no signature,
# full blob ids so `git am -3` can fall back to a 3-way merge on the same base.
_FORMAT = (
    "format-patch", "-1", "--stdout", "-k", "--zero-commit", "--no-signature",
    "--full-index", "--no-numbered", "--no-notes", "--stat=72",
)  # fmt: skip


def export_commit(git: Git, sha: str) -> str:
    return git.run(*_FORMAT, sha).stdout
