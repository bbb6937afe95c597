"""fetch: hash checks, corrupt wheels, the cache, and no network."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from conftest import Project, build_wheel, wheel_name, write_pin


def test_wheel_is_cached_and_verified(project: Project) -> None:
    result = project.run("fetch", "--json")
    data = json.loads(result.out)
    assert result.code == 0
    assert data["upstream"]["sha256"] == project.sha
    assert data["source"] == "cache" and data["pinned"] is True


def test_wrong_hash_is_an_integrity_error_naming_both(
    project: Project, tmp_path: Path
) -> None:
    other = tmp_path / "elsewhere" / wheel_name("0.0.1")
    other.parent.mkdir()
    bad_sha = build_wheel(other, {"sglang/__init__.py": "# tampered\n"})
    cached = project.cached
    cached.unlink()
    result = project.run("fetch", "--wheel", str(other))
    assert result.code == 4
    assert bad_sha in result.err and project.sha in result.err
    assert "the file you passed" in result.err and "index" not in result.err
    assert other.exists(), "the user's own file is never moved or deleted"
    assert not cached.exists(), "a bad file never enters the cache"
    assert not (cached.parent.parent / bad_sha).exists()


def test_bad_cached_download_is_quarantined_not_reused(project: Project) -> None:
    cached = project.cached
    cached.write_bytes(cached.read_bytes() + b"garbage")
    result = project.run("fetch")
    assert result.code == 4
    assert "moved to" in result.err
    rejected = list((project.root / "build/cache/rejected").iterdir())
    assert len(rejected) == 1
    assert not cached.exists()


def test_truncated_wheel_is_a_clear_error(project: Project, tmp_path: Path) -> None:
    # A pin that (wrongly) names the hash of a truncated file: building the tree
    # must fail with a message, not a traceback, and leave nothing half-made.
    truncated = tmp_path / "t" / wheel_name("0.0.1")
    truncated.parent.mkdir()
    data = project.wheel.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    write_pin(project.root, "0.0.1", hashlib.sha256(truncated.read_bytes()).hexdigest())
    tree = tmp_path / "new-tree"
    result = project.run("apply", "--tree", str(tree), "--wheel", str(truncated))
    assert result.code == 4
    assert "truncated or corrupt" in result.err or "not a readable wheel" in result.err
    assert "hint:" in result.err
    assert not tree.exists() or not any(tree.iterdir())


def test_corrupt_member_is_caught(project: Project, tmp_path: Path) -> None:
    corrupt = tmp_path / "c" / wheel_name("0.0.1")
    corrupt.parent.mkdir()
    data = bytearray(project.wheel.read_bytes())
    offset = data.find(b"VALUE")  # stored uncompressed? flip a byte either way
    data[offset if offset > 0 else 60] ^= 0xFF
    corrupt.write_bytes(bytes(data))
    write_pin(project.root, "0.0.1", hashlib.sha256(bytes(data)).hexdigest())
    result = project.run(
        "apply", "--tree", str(tmp_path / "t2"), "--wheel", str(corrupt)
    )
    assert result.code == 4
    assert "corrupt" in result.err or "not a readable wheel" in result.err


def test_no_network_and_no_cache_says_how_to_pass_a_wheel(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    project.cached.unlink()
    # An index nobody listens on, and none of the machine's local mirrors.
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", str(project.root / "no-such-dir"))
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    result = project.run("fetch")
    assert result.code == 1
    assert "could not reach the package index" in result.err
    assert "--wheel" in result.err


def test_other_version_hash_is_recorded_not_trusted(
    project: Project, tmp_path: Path
) -> None:
    newer = tmp_path / wheel_name("0.0.2")
    sha = build_wheel(newer, {"sglang/__init__.py": "# newer\n"}, version="0.0.2")
    result = project.run("fetch", "--upstream", "0.0.2", "--wheel", str(newer))
    assert result.code == 0
    assert "not the pin" in result.out and sha in result.out


def test_wheel_with_an_escaping_member_is_refused(
    project: Project, tmp_path: Path
) -> None:
    evil = tmp_path / "e" / wheel_name("0.0.1")
    evil.parent.mkdir()
    files = {"sglang/__init__.py": "", "sglang/../../escape.py": "x = 1\n"}
    write_pin(project.root, "0.0.1", build_wheel(evil, files))
    tree = tmp_path / "evil-tree"
    result = project.run("apply", "--tree", str(tree), "--wheel", str(evil))
    assert result.code == 4
    assert "unsafe member name 'sglang/../../escape.py'" in result.err
    assert not (tmp_path / "escape.py").exists()
