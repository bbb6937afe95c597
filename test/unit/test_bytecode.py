"""bytecode.prime: checked-hash .pyc beside a tree's modules, compiled once per
file content, and never standing in for a text it was not compiled from."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from conftest import Project, git

from xpu_series.git import Git
from xpu_series.stack import bytecode

MODULES = {
    "python/pkg/__init__.py": "",
    "python/pkg/mod.py": "VALUE = 1\n",
    "python/pkg/old.py": "print 'python 2'\n",
}


def make_tree(path: Path, files: dict[str, str] = MODULES) -> Git:
    for rel, text in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    git(path.parent, "init", "-q", str(path))
    # What the tool's trees have (tree._configure), and upstream's .gitignore.
    (path / ".git/info/exclude").write_text("__pycache__/\n")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "modules")
    return Git(path)


def run_import(tree: Path) -> subprocess.CompletedProcess[str]:
    """`import pkg.mod` from the tree as a test process here would: -v says
    which .pyc files it loaded, and nothing new is written."""
    return subprocess.run(
        [sys.executable, "-v", "-c", "import pkg.mod; print(pkg.mod.VALUE)"],
        env={**os.environ, "PYTHONPATH": str(tree / "python"),
             "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True, text=True, check=True,
    )  # fmt: skip


def pyc(tree: Path, rel: str) -> Path:
    import importlib.util

    return Path(importlib.util.cache_from_source(str(tree / rel)))


def test_a_primed_tree_imports_its_modules_from_the_cache(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree")
    primed = bytecode.prime(tree, tmp_path / "cache")
    assert (primed.modules, primed.compiled, primed.linked) == (3, 2, 2)
    done = run_import(tree.repo)
    assert done.stdout == "1\n"
    assert f"code object from '{pyc(tree.repo, 'python/pkg/mod.py')}'" in done.stderr
    # The tree's git ignores them: a primed tree is still a clean tree.
    assert tree.dirty_paths() == []


def test_a_file_changed_after_priming_runs_its_own_text(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree")
    bytecode.prime(tree, tmp_path / "cache")
    source = tree.repo / "python/pkg/mod.py"
    stat = source.stat()
    # The same size and the same mtime: only the text's hash tells them apart.
    source.write_text("VALUE = 2\n")
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert run_import(tree.repo).stdout == "2\n"


def test_a_second_tree_of_the_same_files_compiles_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = make_tree(tmp_path / "one")
    bytecode.prime(first, cache)
    second = make_tree(tmp_path / "two")
    primed = bytecode.prime(second, cache)
    assert (primed.compiled, primed.linked) == (0, 2)
    rel = "python/pkg/mod.py"
    assert os.path.samefile(pyc(first.repo, rel), pyc(second.repo, rel))
    # Primed again, nothing is to do.
    assert bytecode.prime(second, cache).linked == 0
    assert "code object from" in run_import(second.repo).stderr


def test_an_edited_file_is_not_cached_under_the_index_blob(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    tree = make_tree(tmp_path / "tree")
    (tree.repo / "python/pkg/mod.py").write_text("VALUE = 3\n")
    primed = bytecode.prime(tree, cache)
    assert primed.skipped == 2  # the edited file and the Python 2 one
    assert run_import(tree.repo).stdout == "3\n"
    # A clean tree of the committed text compiles it, from its own text.
    clean = make_tree(tmp_path / "clean")
    assert bytecode.prime(clean, cache).compiled == 1
    assert run_import(clean.repo).stdout == "1\n"


def test_a_file_that_does_not_compile_gets_no_pyc(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree")
    bytecode.prime(tree, tmp_path / "cache")
    assert not pyc(tree.repo, "python/pkg/old.py").exists()
    assert pyc(tree.repo, "python/pkg/__init__.py").is_file()


def test_many_files_compile_in_worker_interpreters(tmp_path: Path) -> None:
    files = {f"python/pkg/m{i}.py": f"X = {i}\n" for i in range(150)}
    tree = make_tree(tmp_path / "tree", {**MODULES, **files})
    primed = bytecode.prime(tree, tmp_path / "cache", workers=2)
    assert (primed.compiled, primed.linked) == (152, 152)
    assert pyc(tree.repo, "python/pkg/m149.py").read_bytes()[4:8] == b"\3\0\0\0"


def test_a_tree_that_would_show_its_pyc_files_is_left_alone(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree")
    (tree.repo / ".git/info/exclude").write_text("")
    primed = bytecode.prime(tree, tmp_path / "cache")
    assert (primed.linked, primed.skipped) == (0, 3)
    assert tree.dirty_paths() == []


def test_an_unwritable_cache_leaves_the_tree_as_it_is(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree")
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache folder would be")
    assert bytecode.prime(tree, blocked) == bytecode.Primed()
    assert not pyc(tree.repo, "python/pkg/mod.py").exists()
    assert run_import(tree.repo).stdout == "1\n"


def test_apply_primes_the_tree_it_builds(three_patches: Project) -> None:
    assert three_patches.run("apply").code == 0
    rel = "python/sglang/srt/other.py"
    compiled = pyc(three_patches.tree, rel)
    assert compiled.is_file()
    done = subprocess.run(
        [sys.executable, "-v", "-c",
         "from sglang.srt.other import answer; print(answer())"],
        env={**os.environ, "PYTHONPATH": str(three_patches.tree / "python"),
             "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stdout == "42\n"
    assert f"code object from '{compiled}'" in done.stderr
    assert git(three_patches.tree, "status", "--porcelain") == ""


def test_two_lanes_priming_one_new_release_compile_it_once(tmp_path: Path) -> None:
    files = {f"python/pkg/m{i}.py": f"X = {i}\n" for i in range(100)}
    trees = [make_tree(tmp_path / name, {**MODULES, **files}) for name in "ab"]
    cache = tmp_path / "cache"
    with ThreadPoolExecutor(2) as pool:
        primed = list(pool.map(lambda tree: bytecode.prime(tree, cache), trees))
    assert sorted(p.compiled for p in primed) == [0, 102]
    assert [p.linked for p in primed] == [102, 102]


def test_an_installed_copy_of_a_primed_tree_gets_its_pyc(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    tree = make_tree(tmp_path / "tree")
    bytecode.prime(tree, cache)
    installed = tmp_path / "installed"
    site = installed / "python"  # where run_import looks
    shutil.copytree(tree.repo / "python", site, ignore=shutil.ignore_patterns("__py*"))
    (site / "pkg" / "extra.py").write_text("Y = 1\n")  # in no tree: not cached
    primed = bytecode.prime_folder(site, cache)
    # old.py never compiled, extra.py was never in a tree: both skipped.
    assert (primed.modules, primed.linked, primed.skipped) == (4, 2, 2)
    rel = "pkg/mod.py"
    assert os.path.samefile(pyc(site, rel), pyc(tree.repo, f"python/{rel}"))
    done = run_import(installed)
    assert f"code object from '{pyc(site, rel)}'" in done.stderr
