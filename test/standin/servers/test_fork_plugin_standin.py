"""The fork wheel's `sglang.srt.plugins` entry point on real SGLang servers on the
CPU stand-in (conftest's shared servers, the plugin on their path): the series'
line is in the log of the server users run, SGLANG_PLUGINS unset (from each
process that loads plugins, with no warning: the running files are the
series'), and not in the log of the server whose SGLANG_PLUGINS names another
plugin; the entry point's name is the one SGLANG_PLUGINS names it by."""

from __future__ import annotations

import hashlib
import json
import re
from importlib import metadata
from pathlib import Path

from standin_servers import OTHER_PLUGIN, TREE

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
    # Ready: each of its processes has loaded plugins by now.
    text = servers["logs"]["on"].read_text()
    found = [m.groups() for m in LINE.finditer(text)]
    # The launcher, the scheduler and the detokenizer each load plugins.
    assert len(found) >= 3, text[-3000:]
    series = identity["series_sha256"][:12]
    assert set(found) == {(series, str(len(identity["patches"])), identity["version"])}
    # The server runs build/sglang, whose files are the series' (checked above).
    assert "differs from the series' file" not in text
    assert "is missing" not in text and "cannot describe" not in text


def test_sglang_plugins_naming_another_plugin_keeps_the_line_out(
    plugin_path: Path, servers: dict
) -> None:
    # The server whose log has the line, but for SGLANG_PLUGINS: the same
    # environment (the plugin on its path), and up and answering.
    on, off = dict(servers["envs"]["on"]), dict(servers["envs"]["off"])
    assert off.pop("SGLANG_PLUGINS") == OTHER_PLUGIN != "xpu_series"
    assert "SGLANG_PLUGINS" not in on and off == on
    text = servers["logs"]["off"].read_text()
    assert not LINE.search(text), text[-3000:]
    assert "sglang-xpu" not in text, text[-3000:]
    # SGLANG_PLUGINS matches entry point names: the fork's is xpu_series, so
    # naming it keeps the line in.
    (dist,) = [
        d for d in metadata.distributions(path=[str(plugin_path)])
        if d.metadata["Name"] == "sglang"
    ]  # fmt: skip
    names = {ep.name for ep in dist.entry_points if ep.group == "sglang.srt.plugins"}
    assert names == {"xpu_series"}
