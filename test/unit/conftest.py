"""Synthetic upstream wheels and projects for the tool tests: no network, no sglang."""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from xpu_series.cli import main

BASE_FILES = {
    "sglang/__init__.py": "",
    "sglang/srt/__init__.py": "",
    "sglang/srt/flags.py": "VALUE = 1\nNAME = 'upstream'\n",
    "sglang/srt/other.py": "def answer():\n    return 41\n",
    "sglang/srt/third.py": "LIMIT = 10\n",
    "sglang/bin/tool.sh": "#!/bin/sh\necho hi\n",
    "sglang/srt/long.py": "".join(f"LINE_{i} = {i}\n" for i in range(1, 13)),
}


def build_wheel(
    path: Path,
    files: dict[str, str],
    version: str = "0.0.1",
    requires: tuple[str, ...] = (),
) -> str:
    """Write a wheel-shaped zip; returns its sha256."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, text in sorted(files.items()):
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            mode = 0o755 if name.endswith(".sh") else 0o644
            info.external_attr = (0o100000 | mode) << 16
            zf.writestr(info, text)
        zf.writestr(f"sglang-{version}.dist-info/RECORD", "")
        zf.writestr(
            f"sglang-{version}.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\n"
            "Tag: cp311-cp311-manylinux_2_34_x86_64\n",
        )
        meta = "".join(f"Requires-Dist: {r}\n" for r in requires)
        zf.writestr(
            f"sglang-{version}.dist-info/METADATA",
            f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n{meta}",
        )
    path.write_bytes(buf.getvalue())
    return hashlib.sha256(buf.getvalue()).hexdigest()


def wheel_name(version: str) -> str:
    return f"sglang-{version}-cp311-cp311-manylinux_2_34_x86_64.whl"


def write_pin(root: Path, version: str, sha: str) -> None:
    (root / "patches").mkdir(parents=True, exist_ok=True)
    (root / "patches" / "upstream.toml").write_text(
        f'[upstream]\nproject = "sglang"\nversion = "{version}"\n'
        f'wheel = "{wheel_name(version)}"\nsha256 = "{sha}"\n\n'
        '[layout]\n"sglang/" = "python/sglang/"\n'
    )


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def local_index(
    folder: Path, monkeypatch: pytest.MonkeyPatch, versions: tuple[str, ...]
) -> Path:
    """A package index of its own for pip (the network boundary): a folder of
    sglang wheels of `versions`, and nothing else pip may ask."""
    folder.mkdir()
    for version in versions:
        build_wheel(folder / wheel_name(version), BASE_FILES, version=version)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    return folder


def cached_wheel(root: Path, version: str, sha: str) -> Path:
    """Where the content-addressed cache keeps a verified wheel."""
    return root / "build/cache/wheels" / sha / wheel_name(version)


def interrupt(
    project: Project, where: str, *args: str, sig: str = "SIGINT"
) -> subprocess.CompletedProcess[str]:
    """The CLI in a child that signals itself at `where` (see interrupter.py)."""
    here = Path(__file__).parent
    env = dict(os.environ, PYTHONPATH=str(here.parents[1] / "python"))
    return subprocess.run(
        [sys.executable, str(here / "interrupter.py"), where, sig,
         "-C", str(project.root), *args],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@dataclass
class Result:
    code: int
    out: str
    err: str


@dataclass
class Project:
    """A scratch sglang-xpu checkout with a synthetic pinned wheel."""

    root: Path
    wheel: Path
    sha: str
    run: Callable[..., Result]

    @property
    def tree(self) -> Path:
        return self.root / "build" / "sglang"

    @property
    def patches(self) -> Path:
        return self.root / "patches"

    @property
    def cached(self) -> Path:
        return cached_wheel(self.root, "0.0.1", self.sha)

    def commit_change(self, rel: str, text: str, subject: str, **fields: str) -> None:
        """Edit a file in the tree and commit it with a reviewer-ready message."""
        path = self.tree / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        body = "\n".join(f"{k.replace('_', '-')}: {v}" for k, v in fields.items())
        message = f"{subject}\n\nWhy this change is needed.\n\n{body}\n"
        git(self.tree, "add", "-A")
        git(self.tree, "commit", "-q", "-m", message)

    def add_patch(self, rel: str, text: str, subject: str, **fields: str) -> None:
        """Commit a change in the tree and export the series with refresh."""
        fields.setdefault("Upstream_Status", "Pending")
        # Each patch its own concern, and where it comes from (check asks both).
        fields.setdefault("Concern", re.sub(r"[^a-z]+", "-", subject[6:].lower()))
        fields.setdefault("Origin", "other, written for the tool tests")
        self.commit_change(rel, text, subject, **fields)
        assert self.run("refresh").code == 0


# Files of a fetched and applied project that name where it was made: the
# wheel's recorded origin and the tree's remote (its base cache).
_PLACED = ("build/cache/wheels/*/origin", "build/sglang/.git/config")


@pytest.fixture(scope="session")
def _fresh_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One project fetched and applied as `project` wants it, made once: a
    test gets a copy (a fetch and an apply are most of a small test's time)."""
    made = tmp_path_factory.mktemp("template")
    root = made / "proj"
    root.mkdir()
    wheel = made / wheel_name("0.0.1")
    sha = build_wheel(wheel, BASE_FILES)
    write_pin(root, "0.0.1", sha)
    (root / "patches" / "series").write_text("# test series\n")
    with pytest.MonkeyPatch.context() as env:
        env.delenv("XPU_SERIES_CACHE", raising=False)  # its cache in the project
        for args in (("fetch", "--wheel", str(wheel)), ("apply",)):
            code = main(["-C", str(root), *args])
            assert code == 0, f"the template project's {args[0]} failed"
    return made


@pytest.fixture
def project(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], _fresh_project: Path
) -> Project:
    """A scratch project on the synthetic pin, fetched and applied: a copy of
    the session's template with its two recorded paths moved to the copy."""
    root = tmp_path / "proj"
    shutil.copytree(_fresh_project / "proj", root, symlinks=True)
    wheel = tmp_path / wheel_name("0.0.1")
    shutil.copy2(_fresh_project / wheel.name, wheel)
    for pattern in _PLACED:
        for path in root.glob(pattern):
            text = path.read_text().replace(str(_fresh_project), str(tmp_path))
            path.write_text(text)
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()

    def run(*args: str) -> Result:
        capsys.readouterr()
        code = main(["-C", str(root), *args])
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return Project(root, wheel, sha, run)


@pytest.fixture
def three_patches(project: Project) -> Project:
    """A series of three patches touching flags.py, other.py and third.py."""
    project.add_patch(
        "python/sglang/srt/flags.py",
        "VALUE = 2\nNAME = 'upstream'\n",
        "[XPU] Raise VALUE",
    )
    project.add_patch(
        "python/sglang/srt/other.py",
        "def answer():\n    return 42\n",
        "[XPU] Fix the answer",
    )
    project.add_patch(
        "python/sglang/srt/third.py", "LIMIT = 20\n", "[XPU] Raise the limit"
    )
    return project
