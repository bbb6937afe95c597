"""The fork wheel's `sglang.srt.plugins` entry point on real SGLang servers on the
CPU stand-in (conftest's shared servers, the plugin on their path): the series'
line is in each server's log (from each process that loads plugins, with no
warning: the running files are the series'), and SGLANG_PLUGINS naming another
plugin keeps it out."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

from standin_servers import TREE, plugin_env

LINE = re.compile(
    r"sglang-xpu: series s([0-9a-f]{12}) \((\d+) patches, .* on sglang (\S+)"
)


def test_the_server_logs_the_series_in_every_process_that_loads_plugins(
    plugin_path: Path, servers: dict
) -> None:
    dist = next(plugin_path.glob("sglang-*.dist-info"))
    identity = json.loads((dist / "xpu_series.json").read_text())
    stale = [
        rel
        for rel, sha in identity["files"].items()
        if sha and hashlib.sha256((TREE / rel).read_bytes()).hexdigest() != sha
    ]
    assert not stale, (
        f"build/sglang is not the series: run 'xpu-series apply' ({stale})"
    )
    series = identity["series_sha256"][:12]
    for log in servers["logs"].values():
        # Ready: each of its processes has loaded plugins by now.
        text = log.read_text()
        found = [m.groups() for m in LINE.finditer(text)]
        # The launcher, the scheduler and the detokenizer each load plugins.
        assert len(found) >= 3, text[-3000:]
        expected = (series, str(len(identity["patches"])), identity["version"])
        assert set(found) == {expected}
        # The server runs build/sglang, whose files are the series' (checked above).
        assert "differs from the series' file" not in text
        assert "is missing" not in text and "cannot describe" not in text


def _load_plugins(env: dict[str, str]) -> str:
    """What sglang's own loader (the one each server process calls) prints."""
    code = "from sglang.srt.plugins import load_plugins; load_plugins()"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


def test_sglang_plugins_naming_another_plugin_keeps_the_line_out(
    plugin_path: Path,
) -> None:
    kept = _load_plugins(plugin_env(plugin_path, SGLANG_PLUGINS="xpu_series"))
    assert LINE.search(kept), kept[-3000:]
    other = _load_plugins(plugin_env(plugin_path, SGLANG_PLUGINS="someone_else"))
    assert not LINE.search(other), other[-3000:]
