"""fetch: hash checks, corrupt wheels, the cache, and no network."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import Project, build_wheel, wheel_name

from xpu_series.pin import load_pin
from xpu_series.wheel import fetch_wheel


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
    cached = project.root / "build/cache/wheels" / wheel_name("0.0.1")
    cached.unlink()
    result = project.run("fetch", "--wheel", str(other))
    assert result.code == 4
    assert bad_sha in result.err and project.sha in result.err
    assert other.exists(), "the user's own file is never moved or deleted"
    assert not cached.exists(), "a bad file never enters the cache"


def test_bad_cached_download_is_quarantined_not_reused(project: Project) -> None:
    cached = project.root / "build/cache/wheels" / wheel_name("0.0.1")
    cached.write_bytes(cached.read_bytes() + b"garbage")
    result = project.run("fetch")
    assert result.code == 4
    assert "moved to" in result.err
    rejected = list((project.root / "build/cache/rejected").iterdir())
    assert len(rejected) == 1
    assert not cached.exists()


def test_truncated_wheel_is_a_clear_error(project: Project, tmp_path: Path) -> None:
    # A pin that (wrongly) names the hash of a truncated file: unpacking must fail
    # with a message, not a traceback.
    truncated = tmp_path / "t" / wheel_name("0.0.1")
    truncated.parent.mkdir()
    truncated.write_bytes(project.wheel.read_bytes()[:200])
    pin = load_pin(project.patches / "upstream.toml")
    from hashlib import sha256

    from xpu_series.errors import WheelError
    from xpu_series.wheel import unpack_wheel

    digest = sha256(truncated.read_bytes()).hexdigest()
    pin = pin.__class__(**{**pin.__dict__, "sha256": digest})
    fetched = fetch_wheel(pin, tmp_path / "cache", local=truncated)
    with pytest.raises(WheelError, match="not a readable wheel|truncated or corrupt"):
        unpack_wheel(fetched.path, pin, tmp_path / "out")


def test_no_network_and_no_cache_says_how_to_pass_a_wheel(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    (project.root / "build/cache/wheels" / wheel_name("0.0.1")).unlink()
    # An index nobody listens on, and none of the machine's local mirrors.
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", str(project.root / "no-such-dir"))
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    result = project.run("fetch")
    assert result.code == 1
    assert "could not get" in result.err and "package index" in result.err
    assert "--wheel" in result.err


def test_other_version_hash_is_recorded_not_trusted(
    project: Project, tmp_path: Path
) -> None:
    newer = tmp_path / wheel_name("0.0.2")
    sha = build_wheel(newer, {"sglang/__init__.py": "# newer\n"}, version="0.0.2")
    result = project.run("fetch", "--upstream", "0.0.2", "--wheel", str(newer))
    assert result.code == 0
    assert "not the pin" in result.out and sha in result.out
