"""Materialize the pristine upstream as a git tree, reusing a cached base."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from xpu_series.errors import TreeError
from xpu_series.git import Git
from xpu_series.pin import Pin
from xpu_series.wheel import FetchedWheel, unpack_wheel

UPSTREAM_TAG = "upstream"
BRANCH = "xpu"
APPLIED_REF = "refs/xpu-series/applied"
RECORD = "xpu-series.json"
# A fixed date makes the base commit id a function of the wheel's content alone.
_BASE_DATE = "2000-01-01T00:00:00+0000"


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


def _commit_base(git: Git, pin: Pin, digest: str) -> str:
    git.run("add", "-A")
    env = {"GIT_AUTHOR_DATE": _BASE_DATE, "GIT_COMMITTER_DATE": _BASE_DATE}
    git.run(
        "commit", "-q", "--no-verify", "-m",
        f"{pin.project} {pin.version} (wheel sha256 {digest})",
        env=env,
    )  # fmt: skip
    git.run("tag", "-f", UPSTREAM_TAG)
    return git.out("rev-parse", "HEAD")


def _base_cache(cache: Path, digest: str) -> Path:
    return cache / "bases" / f"{digest}.git"


def _unpack_base(wheel: FetchedWheel, pin: Pin, tree: Path) -> str:
    tree.mkdir(parents=True, exist_ok=True)
    unpack_wheel(wheel.path, pin, tree)
    git = Git(tree)
    git.run("init", "-q")
    _configure(git)
    return _commit_base(git, pin, wheel.sha256)


def _configure(git: Git) -> None:
    # Fast zlib for the 4,000+ loose objects of the base; byte-identical blobs anyway.
    git.run("config", "core.looseCompression", "1")
    # Imports leave __pycache__ behind; they are not local edits.
    exclude = git.git_dir() / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    exclude.write_text("__pycache__/\n*.py[co]\n")


def _store_base(tree: Path, cache_repo: Path) -> None:
    cache_repo.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".base-", dir=cache_repo.parent) as tmp:
        staging = Path(tmp) / "base.git"
        # A local clone hard-links the objects, so storing the base costs no copy.
        Git(cache_repo.parent).run(
            "clone", "-q", "--bare", "--local", str(tree), str(staging)
        )
        if not cache_repo.exists():
            os.replace(staging, cache_repo)


def _ensure_base_cache(wheel: FetchedWheel, pin: Pin, cache: Path) -> Path:
    cache_repo = _base_cache(cache, wheel.sha256)
    if not cache_repo.is_dir():
        cache_repo.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".unpack-", dir=cache_repo.parent) as t:
            staging = Path(t) / "tree"
            _unpack_base(wheel, pin, staging)
            _store_base(staging, cache_repo)
    return cache_repo


def _is_empty_dir(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


def materialize_base(
    wheel: FetchedWheel, pin: Pin, tree: Path, cache: Path
) -> BaseInfo:
    """Put `tree` at the pristine upstream commit tagged `upstream` on branch `xpu`.

    The caller has already checked that an existing tree may be reset (clean, or
    its edits saved). Branches and stashes of an existing tree are kept.
    """
    cache_repo = _base_cache(cache, wheel.sha256)
    git = Git(tree)
    if git.is_repo():
        current = git.rev(UPSTREAM_TAG)
        if not (current and read_record(git).get("sha256") == wheel.sha256):
            # Another upstream lives here: bring the new base in beside it.
            cache_repo = _ensure_base_cache(wheel, pin, cache)
            git.run("fetch", "-q", str(cache_repo), f"+refs/tags/{UPSTREAM_TAG}:"
                    f"refs/tags/{UPSTREAM_TAG}")  # fmt: skip
        git.run("checkout", "-q", "-f", "-B", BRANCH, UPSTREAM_TAG)
        source = "tree"
    elif tree.exists() and not _is_empty_dir(tree):
        raise TreeError(
            f"{tree} exists and is not a git repository",
            hint="pass an empty or new --tree, or an upstream git checkout",
        )
    elif cache_repo.is_dir():
        if tree.exists():
            tree.rmdir()
        tree.parent.mkdir(parents=True, exist_ok=True)
        Git(tree.parent).run(
            "clone", "-q", "--local", "--no-checkout", str(cache_repo), str(tree)
        )
        _configure(git)
        git.run("checkout", "-q", "-f", "-B", BRANCH, UPSTREAM_TAG)
        source = "cache"
    else:
        _unpack_base(wheel, pin, tree)
        git.run("checkout", "-q", "-B", BRANCH)
        _store_base(tree, cache_repo)
        source = "unpacked"
    commit = git.out("rev-parse", UPSTREAM_TAG)
    write_record(
        git, {"version": wheel.version, "sha256": wheel.sha256, "base": commit}
    )
    return BaseInfo(commit, wheel.version, wheel.sha256, source)


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
