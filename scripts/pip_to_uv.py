#!/usr/bin/env python3
"""uv's options for where this machine's pip finds packages (`pip config list`).

    python3 scripts/pip_to_uv.py PYTHON     # one option per line, for bootstrap

uv reads none of pip's configuration, and a machine's pip may be pointed at local
mirrors, extra wheel folders and a constraints file (this one caps torch at what
lies on its disk). Bootstrap installs with uv, so it passes the same sources and
constraints on, and resolves as pip does: the best version across every index.
Standard library only (it runs before .venv has anything in it).
"""

from __future__ import annotations

import shlex
import subprocess
import sys

# pip option -> uv option; the values of each may be several, space-separated.
OPTIONS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}


def uv_args(config: str) -> list[str]:
    """uv options from the output of `pip config list`.

    >>> uv_args("global.extra-index-url='file:///a file:///b'\\n"
    ...         ":env:.find-links='/opt/wheels'\\nglobal.timeout='60'\\n")
    ['--index-strategy', 'unsafe-best-match', '--extra-index-url', 'file:///a', \
'--extra-index-url', 'file:///b', '--find-links', '/opt/wheels']
    """
    args = ["--index-strategy", "unsafe-best-match"]
    seen: set[tuple[str, str]] = set()
    for line in config.splitlines():
        key, sep, raw = line.partition("=")
        if not sep:
            continue
        option = OPTIONS.get(key.rpartition(".")[2].strip())
        if option is None:
            continue
        for value in shlex.split(raw)[0].split() if raw.strip() else []:
            if (option, value) not in seen:
                seen.add((option, value))
                args += [option, value]
    return args


def main(argv: list[str]) -> int:
    python = argv[0] if argv else sys.executable
    done = subprocess.run(
        [python, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        check=False,
    )
    print("\n".join(uv_args(done.stdout if done.returncode == 0 else "")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
