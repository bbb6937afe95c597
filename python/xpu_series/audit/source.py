"""The files an audit reads: a folder on disk, or a commit of a git repository."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from xpu_series.errors import NetworkError, TreeError, UsageError
from xpu_series.git import Git, read_blobs
from xpu_series.lock import tree_lock
from xpu_series.project import Project
from xpu_series.stack.engine import apply_patches
from xpu_series.stack.tree import (
    UPSTREAM_TAG,
    ensure_base_cache,
    materialize_base,
    repair,
)
from xpu_series.stack.wheel import fetch_wheel, index_releases

PREFIX = "python/sglang/"


def blob_id(data: bytes) -> str:
    """git's id of a blob with this content (so a folder and a commit agree).

    >>> blob_id(b"")
    'e69de29bb2d1d6434b8b29ae775ad8c2e48c5391'
    """
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass(frozen=True)
class TreeFiles:
    """The `.py` files under python/sglang/ of one tree, by path: (blob id, reader)."""

    label: str  # what the report says it audited
    blobs: dict[str, str]  # path -> blob id
    root: Path | None = None  # a folder: read from disk
    repo: Path | None = None  # a commit: read from this repository
    commit: str = ""  # the commit, when read from a repository

    def read(self, paths: list[str]) -> dict[str, bytes]:
        if self.root is not None:
            return {p: (self.root / p).read_bytes() for p in paths}
        assert self.repo is not None
        by_blob = read_blobs(self.repo, sorted({self.blobs[p] for p in paths}))
        return {p: by_blob[self.blobs[p]] for p in paths}

    def digest(self) -> str:
        h = hashlib.sha256()
        for path in sorted(self.blobs):
            h.update(f"{path}\0{self.blobs[path]}\n".encode())
        return h.hexdigest()


def _not_sglang(where: Path | str) -> TreeError:
    return TreeError(
        f"{where} has no python/sglang/ package: it is not an sglang tree",
        hint="pass a tree made by 'xpu-series apply' (build/sglang) or an upstream "
        "checkout of sgl-project/sglang",
    )


def folder_files(root: Path, label: str = "") -> TreeFiles:
    """Every `.py` under `root`/python/sglang, as it is on disk (edits included)."""
    base = root / PREFIX
    if not (base / "__init__.py").is_file():
        raise _not_sglang(root)
    blobs: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in filenames:
            if name.endswith(".py"):
                full = Path(dirpath) / name
                rel = full.relative_to(root).as_posix()
                blobs[rel] = blob_id(full.read_bytes())
    return TreeFiles(label or str(root), blobs, root=root)


def commit_files(repo: Path, commit: str, label: str) -> TreeFiles:
    """Every `.py` under python/sglang of `commit` in `repo` (bare or not)."""
    out = Git(repo).run("ls-tree", "-r", "-z", commit, "--", PREFIX).stdout
    blobs: dict[str, str] = {}
    for entry in out.split("\0"):
        if not entry:
            continue
        meta, path = entry.split("\t", 1)
        _mode, kind, blob = meta.split()
        if kind == "blob" and path.endswith(".py"):
            blobs[path] = blob
    if f"{PREFIX}__init__.py" not in blobs:
        raise _not_sglang(f"{repo} at {commit[:12]}")
    return TreeFiles(label, blobs, repo=repo, commit=commit)


def release_base(project: Project, version: str) -> tuple[Path, str]:
    """The cached bare repository of release `version` and its pristine commit
    (fetched and unpacked on first use; an unknown release is a usage error)."""
    pin = project.pin.for_version(version)
    try:
        wheel = fetch_wheel(pin, project.cache_dir)
    except NetworkError as exc:
        if "does not exist" not in exc.message:
            raise
        listed = index_releases(pin)
        shown = ", ".join(listed[-12:])
        raise UsageError(
            f"sglang {version} is not a release on the package index; the newest "
            f"are {shown} ({len(listed)} in all)",
            hint=f"pick one of those, e.g. --upstream {listed[-1]}",
        ) from None
    repo, _built = ensure_base_cache(wheel, pin, project.cache_dir)
    commit = Git(repo).out("rev-parse", f"{UPSTREAM_TAG}^{{commit}}")
    return repo, commit


def series_tree(project: Project, version: str) -> Path:
    """A scratch tree of `version` with the series as it applies there
    (`build/audit/<version>`), rebuilt only when the wheel or the series change."""
    pin = project.pin.for_version(version)
    wheel = fetch_wheel(pin, project.cache_dir)
    series = project.series(version)
    key = hashlib.sha256(f"{wheel.sha256}\0{series.digest()}".encode()).hexdigest()
    tree = project.build_dir / "audit" / version
    stamp = tree / ".git" / "xpu-series-audit-key"
    with tree_lock(tree, "audit"):
        git = Git(tree)
        if git.is_repo() and stamp.is_file() and stamp.read_text() == key:
            if not git.dirty_paths():
                return tree
        if git.is_repo():
            repair(git)
        materialize_base(wheel, pin, tree, project.cache_dir)
        apply_patches(git, series.patches, upstream_version=version)
        stamp.write_text(key)
    return tree


def pristine_tree(project: Project, version: str) -> Path:
    """A checkout of release `version` as shipped (`build/audit/<version>-pristine`),
    for a stand-in run of upstream's own code."""
    pin = project.pin.for_version(version)
    wheel = fetch_wheel(pin, project.cache_dir)
    tree = project.build_dir / "audit" / f"{version}-pristine"
    with tree_lock(tree, "audit"):
        git = Git(tree)
        if git.is_repo():
            repair(git)
        materialize_base(wheel, pin, tree, project.cache_dir)
    return tree
