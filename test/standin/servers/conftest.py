"""test/standin/servers: the real servers its tests share, two stand-in servers
(chunked and not) with the fork wheel's plugin on their path, started once for
the whole run (a server start costs most of a minute of CPU); the unchunked one
with SGLANG_PLUGINS naming another plugin, so that the filter is seen on a real
server too. A folder of its own: the patches' registered tests read
test/standin's files, not these."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from standin_servers import (
    CHUNK,
    OTHER_PLUGIN,
    TREE,
    build_plugin_path,
    plugin_env,
    start_server,
    wait_ready,
)


@pytest.fixture(scope="session")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fork wheel's plugin, ready for PYTHONPATH (see build_plugin_path)."""
    if not (TREE.parent / ".git").exists():
        pytest.skip("no patched tree at build/sglang: run scripts/bootstrap first")
    return build_plugin_path(
        tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("plugins")
    )


@pytest.fixture(scope="session")
def servers(
    tmp_path_factory: pytest.TempPathFactory, plugin_path: Path
) -> Iterator[dict]:
    """Two servers on the stand-in, started together, the fork's plugin on
    their path: chunked (CHUNK), with SGLANG_PLUGINS unset as users run it, and
    not chunked, with SGLANG_PLUGINS naming only OTHER_PLUGIN (the plugin only
    logs, so generations do not depend on it). Their URLs under "on" and "off",
    the files their output goes to under "logs", their environments under
    "envs"."""
    folder = tmp_path_factory.mktemp("servers")
    logs = {name: folder / f"{name}.log" for name in ("on", "off")}
    envs = {
        "on": plugin_env(plugin_path),
        "off": plugin_env(plugin_path, SGLANG_PLUGINS=OTHER_PLUGIN),
    }
    started = [
        start_server(CHUNK, logs["on"], envs["on"]),
        start_server(-1, logs["off"], envs["off"]),
    ]
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda s, n: wait_ready(*s, logs[n]), started,
                          ["on", "off"]))  # fmt: skip
        yield {"on": started[0][1], "off": started[1][1], "logs": logs, "envs": envs}
    finally:
        for proc, _ in started:
            proc.terminate()
        for proc, _ in started:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
