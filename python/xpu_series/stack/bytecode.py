"""Checked-hash bytecode for a tree's modules, from a cache keyed by git blob id.

Every process that imports sglang from a tree (a test run, a fork of a worker,
each of a real server's three processes) compiles the modules it imports unless
a .pyc is beside them, and this machine, like many CI machines, sets
PYTHONDONTWRITEBYTECODE, so none ever is. `prime` puts one beside each tracked
module: compiled once per file content (the cache is keyed by the git blob id),
then hard-linked into every tree that has that content. The .pyc files are
checked-hash ones: Python compares the source's hash with the one the .pyc
carries on every import, so a file changed since (a checkout, a mutant, a local
edit) is compiled from its own text, whatever its mtime and size say.

    python -m xpu_series.stack.bytecode LIST   (the compile worker `prime` starts)
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import py_compile
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from xpu_series.git import Git

# Below this many files to compile, starting interpreters costs more than it saves.
_IN_PROCESS = 64


@dataclass(frozen=True)
class Primed:
    """What one `prime` did: modules given a .pyc, of which newly compiled."""

    modules: int = 0
    linked: int = 0
    compiled: int = 0
    # Modules left to compile in memory: edited since the index, or not Python 3.
    skipped: int = 0


def cache_folder(cache: Path) -> Path:
    """Where this interpreter's .pyc files live (the magic number changes with
    the bytecode format, the tag with the interpreter)."""
    tag = sys.implementation.cache_tag or "none"
    return cache / "bytecode" / f"{tag}-{importlib.util.MAGIC_NUMBER.hex()}"


def _cached(folder: Path, blob: str) -> Path:
    """The cache's .pyc of the file whose git blob id is `blob`."""
    return folder / blob[:2] / f"{blob}.pyc"


def _blob_id(data: bytes, length: int) -> str:
    """git's object id of a file with `data` (sha1, or sha256 for 64 digits)."""
    digest = hashlib.sha1 if length == 40 else hashlib.sha256
    return digest(b"blob %d\0" % len(data) + data).hexdigest()


def _modules(git: Git) -> list[tuple[str, str]]:
    """(blob id, path) of every tracked .py file at stage 0 of the index."""
    out = git.run("ls-files", "-s", "-z", "--", "*.py").stdout
    rows = []
    for entry in out.split("\0"):
        if not entry:
            continue
        meta, _, path = entry.partition("\t")
        mode, blob, stage = meta.split()
        if stage == "0" and mode in ("100644", "100755"):
            rows.append((blob, path))
    return rows


def _place(cached: Path, dest: Path) -> bool:
    """Link `cached` at `dest` (renamed in: a reader never sees half a file);
    False when `dest` already is that file."""
    try:
        if os.path.samefile(cached, dest):
            return False
    except OSError:
        pass
    dest.parent.mkdir(exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        os.link(cached, tmp)
    except OSError:
        shutil.copyfile(cached, tmp)  # another file system: a copy will do
    os.replace(tmp, dest)
    return True


def _compile_all(jobs: list[tuple[str, str]], workers: int) -> None:
    """Compile (source, .pyc) pairs in `workers` interpreters side by side."""
    if len(jobs) < _IN_PROCESS:
        _compile(jobs)  # fewer than an interpreter's start is worth
        return
    workers = max(1, min(workers, len(jobs) // _IN_PROCESS))
    with tempfile.TemporaryDirectory(prefix="xpu-bytecode-") as tmp:
        procs = []
        for i in range(workers):
            listing = Path(tmp) / f"{i}.json"
            listing.write_text(json.dumps(jobs[i::workers]))
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "xpu_series.stack.bytecode", str(listing)],
                    env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        try:
            for proc in procs:
                proc.wait()
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()


def prime(git: Git, cache: Path, workers: int = 2) -> Primed:
    """Put a checked-hash .pyc beside every tracked module of `git`'s work tree
    whose file is what the index has, compiling only contents the cache lacks.

    Only a speed-up: a tree or cache it cannot write to is left as it is.
    """
    try:
        return _prime(git, cache, workers)
    except OSError:
        return Primed()


def _prime(git: Git, cache: Path, workers: int) -> Primed:
    folder = cache_folder(cache)
    folder.mkdir(parents=True, exist_ok=True)
    rows = _modules(git)
    if rows:
        probe = importlib.util.cache_from_source(str(git.repo / rows[0][1]))
        rel = os.path.relpath(probe, git.repo)
        if not git.run("check-ignore", "-q", "--no-index", rel, check=False).ok:
            # .pyc files would be untracked files in it: a tree this tool did
            # not set up stays as clean as it was.
            return Primed(modules=len(rows), skipped=len(rows))
    todo: list[tuple[str, str]] = []
    places: list[tuple[Path, Path]] = []
    skipped = 0
    for blob, rel in rows:
        source = git.repo / rel
        cached = _cached(folder, blob)
        if not cached.is_file():
            try:
                data = source.read_bytes()
            except OSError:
                skipped += 1
                continue
            if _blob_id(data, len(blob)) != blob:
                # Edited since the index: its text is not the blob's, so its
                # .pyc must not be cached under the blob's name.
                skipped += 1
                continue
            cached.parent.mkdir(exist_ok=True)
            todo.append((str(source), str(cached)))
        places.append((cached, Path(importlib.util.cache_from_source(str(source)))))
    mine: list[tuple[str, str]] = []
    if todo:
        # One compiler per cache at a time: the matrix's two lanes (and verify
        # beside it) reach a new release together and would compile it twice.
        # The second finds the first's .pyc once it has the lock.
        with (folder / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            mine = [job for job in todo if not Path(job[1]).is_file()]
            _compile_all(mine, workers)
    linked = 0
    for cached, dest in places:
        if cached.is_file():
            linked += _place(cached, dest)
        else:
            skipped += 1  # did not compile (Python 2 syntax, say): left alone
    compiled = sum(Path(target).is_file() for _, target in mine)
    return Primed(len(rows), linked, compiled, skipped)


def prime_folder(folder: Path, cache: Path) -> Primed:
    """Link the cached .pyc of every module under `folder` whose content the
    cache holds: an installed sglang (no git, no index) whose files are those of
    a primed tree. Compiles nothing; a module the cache lacks is skipped."""
    cached_folder = cache_folder(cache)
    linked = skipped = modules = 0
    try:
        for source in sorted(folder.rglob("*.py")):
            modules += 1
            blob = _blob_id(source.read_bytes(), 40)
            cached = _cached(cached_folder, blob)
            if not cached.is_file():
                skipped += 1
                continue
            dest = Path(importlib.util.cache_from_source(str(source)))
            linked += _place(cached, dest)
    except OSError:
        pass  # only a speed-up: what could not be linked compiles in memory
    return Primed(modules, linked, 0, skipped)


def _compile(jobs: list[tuple[str, str]]) -> None:
    """Compile each (source, .pyc); one that fails is skipped."""
    for source, target in jobs:
        try:
            py_compile.compile(
                source,
                cfile=target,
                doraise=True,
                invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
            )
        except (py_compile.PyCompileError, OSError, ValueError):
            continue


if __name__ == "__main__":
    _compile(json.loads(Path(sys.argv[1]).read_text()))
