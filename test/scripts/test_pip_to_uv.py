"""scripts/pip_to_uv.py: bootstrap's uv looks where this machine's pip looks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import SCRIPTS, load_script


def _uv_args(tmp_path: Path, config: str, **env: str) -> list[str]:
    conf = tmp_path / "pip.conf"
    conf.write_text(config)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    # Only this file: no user, site or global configuration of the machine.
    clean.update(PIP_CONFIG_FILE=str(conf), XDG_CONFIG_DIRS=str(tmp_path), **env)
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "pip_to_uv.py"), sys.executable],
        capture_output=True, text=True, env=clean, check=True,
    )  # fmt: skip
    return done.stdout.split()


def test_every_index_folder_and_constraint_of_pip_reaches_uv(tmp_path) -> None:
    config = (
        "[global]\n"
        "index-url = https://mirror.example/simple\n"
        "extra-index-url = file:///opt/a/simple file:///opt/b/simple\n"
        "constraint = /etc/caps.txt\n"
        "timeout = 60\n"
    )
    args = _uv_args(tmp_path, config, PIP_FIND_LINKS="/opt/wheels")
    pairs = list(zip(args[::2], args[1::2], strict=True))
    assert pairs[0] == ("--index-strategy", "unsafe-best-match")
    assert set(pairs[1:]) == {
        ("--index-url", "https://mirror.example/simple"),
        ("--extra-index-url", "file:///opt/a/simple"),
        ("--extra-index-url", "file:///opt/b/simple"),
        ("--constraint", "/etc/caps.txt"),
        ("--find-links", "/opt/wheels"),
    }
    assert len(pairs) == 6  # nothing twice, nothing of pip's other options


def test_a_pip_without_configuration_leaves_uv_on_its_defaults() -> None:
    uv_args = load_script("pip_to_uv.py").uv_args
    assert uv_args("") == ["--index-strategy", "unsafe-best-match"]
    # What pip says of other options, or of none, is no source of packages.
    assert uv_args("global.timeout='60'\nglobal.cert=''\n") == uv_args("")
