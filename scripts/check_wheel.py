#!/usr/bin/env python3
"""CI: the fork wheel of the pin, built twice and installed by a real pip.

- `xpu-series wheel` twice into two folders: the same bytes both times;
- a fresh `python3.11 -m venv` (with its own pip): `pip install --no-deps` of the
  wheel; `pip show sglang` reports the series' label; every file of the installed
  sglang package is build/sglang's (the applied tree) byte for byte, and the
  files the series changes are among them; importlib.metadata finds the plugin's
  entry point there; the fast tests of the run's seeded sample of the patches
  pass against that install, with sglang imported from it (as
  scripts/check_overlay.py runs them);
- `pip uninstall -y sglang` leaves no file of it behind;
- the official image's order: `pip install --no-deps` of the stock release, then
  the fork over it (the label and the tree's files again), then `pip uninstall`
  and `pip install --no-deps` of the stock release: every file as stock had it.
  The fork goes over stock as the image's wheel mode puts it there:
  `docker/install-fork.sh --mode wheel --wheels DIR`, DIR holding the wheel
  beside one of another series' label, must install the series' wheel and build
  nothing.

Prints a line per step with its time; exits non-zero on the first failure.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = ROOT / ".venv" / "bin" / "python"
TREE = ROOT / "build" / "sglang"
sys.path.insert(0, str(ROOT / "scripts"))

# The overlay's check already runs the patches' tests on an install and reads its
# plugin registration; the wheel's install gets the same checks.
from check_overlay import (  # noqa: E402
    Failed,
    plugin_registered,
    run,
    run_carried_tests,
    sampled_tests,
)


def tool(*args: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    cmd = [str(PY), "-m", "xpu_series", "-C", str(ROOT), "--json", *args]
    return json.loads(run(cmd, env=env).stdout)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(site: Path) -> dict[str, str]:
    """Every file under `site` by content; bytecode by name only (pip compiles it
    anew on each install, with the time in it)."""
    return {
        p.relative_to(site).as_posix(): "" if p.suffix == ".pyc" else sha256(p)
        for p in sorted(site.rglob("*"))
        if p.is_file()
    }


def differences(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return sorted(
        k for k in before.keys() | after.keys() if before.get(k) != after.get(k)
    )


class Venv:
    """A fresh virtualenv of python3.11 with its own pip."""

    def __init__(self, folder: Path, python: str) -> None:
        run([python, "-m", "venv", str(folder)])
        self.python = str(folder / "bin" / "python")
        code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
        self.site = Path(run([self.python, "-c", code]).stdout.strip())

    def pip(self, *args: str) -> str:
        cmd = [self.python, "-m", "pip", "--disable-pip-version-check", *args]
        return run(cmd).stdout

    def show(self) -> str:
        return self.pip("show", "sglang")

    def version(self) -> str:
        line = next(x for x in self.show().splitlines() if x.startswith("Version:"))
        return line.split(":", 1)[1].strip()


def tree_files() -> dict[str, str]:
    """sglang's files in the applied tree, as install paths: sha256 of each."""
    listed = run(["git", "-C", str(TREE), "ls-files", "-z", "python/sglang"]).stdout
    return {
        name[len("python/") :]: sha256(TREE / name)
        for name in listed.split("\0")
        if name
    }


def installed_files(site: Path) -> dict[str, str]:
    """What the install's RECORD lists under sglang/ (bytecode aside)."""
    dist = next(site.glob("sglang-*.dist-info"))
    with open(dist / "RECORD", newline="") as fh:
        rows = [row[0] for row in csv.reader(fh) if row]
    return {
        rel: sha256(site / rel)
        for rel in rows
        if rel.startswith("sglang/") and not rel.endswith(".pyc")
    }


def check_is_the_tree(venv: Venv, built: dict, expected: dict[str, str]) -> str:
    version = venv.version()
    if version != built["version"]:
        raise Failed(f"pip show sglang says {version}, not {built['version']}")
    got = installed_files(venv.site)
    wrong = differences(expected, got)
    if wrong:
        raise Failed(
            f"{len(wrong)} installed file(s) are not build/sglang's: "
            + ", ".join(wrong[:10])
        )
    missing = [f for f in built["files"] if f not in got]
    if missing:
        raise Failed(f"the series' files are not installed: {', '.join(missing)}")
    plugin = plugin_registered(venv.site)
    if plugin:
        raise Failed(f"the installed fork's plugin: {plugin}")
    return f"{len(got)} files are the tree's ({len(built['files'])} patched)"


def install_fork_prebuilt(venv: Venv, wheel: Path, folder: Path) -> str:
    """docker/install-fork.sh's wheel mode, as the image runs it, with `wheel` in
    `folder` beside a decoy of another series' label: it must take `wheel`."""
    folder.mkdir()
    shutil.copy(wheel, folder / wheel.name)
    release, label = wheel.name.split("-")[1].split("+")
    decoy = wheel.name.replace(f"+{label}-", "+xpu.s000000000000-")
    shutil.copy(wheel, folder / decoy)
    script = ROOT / "docker" / "install-fork.sh"
    cmd = ["bash", str(script), "--mode", "wheel", "--python", venv.python,
           "--wheels", str(folder)]  # fmt: skip
    out = run(cmd).stdout
    said = f"installing the prebuilt fork wheel {wheel.name}"
    if said not in out or "building it" in out:
        raise Failed(f"install-fork.sh did not take the prebuilt wheel:\n{out}")
    if venv.version() != f"{release}+{label}":
        raise Failed(f"install-fork.sh installed sglang {venv.version()}")
    return f"took {wheel.name}, not the decoy"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default="python3.11", help="the venv's Python")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args()
    start = time.monotonic()

    def step(text: str) -> None:
        print(f"[{time.monotonic() - start:6.1f}s] {text}", flush=True)

    # No pip here compiles the ~4700 modules it installs (13 s of CPU per
    # install, four installs): the tests on an install use bytecode primed from
    # the cache (run_carried_tests), and the snapshots compare .pyc by name only.
    # pip reads the variable of a `--no-` option inverted: "0" turns compiling off
    # for this script's pips and the one docker/install-fork.sh runs.
    os.environ["PIP_NO_COMPILE"] = "0"
    if not (TREE / ".git").exists():
        print(f"FAILED: no applied tree at {TREE}: run 'xpu-series apply' first")
        return 1
    work = Path(tempfile.mkdtemp(prefix="check-wheel-", dir=ROOT / "build"))
    try:
        first = tool("wheel", "--out", str(work / "one"))
        step(f"built {first['name']}: {first['size']} bytes, sha256 {first['sha256']}")
        second = tool("wheel", "--out", str(work / "two"))
        if second["sha256"] != first["sha256"]:
            raise Failed(f"two builds differ: {first['sha256']} and {second['sha256']}")
        step("built again into another folder: the same sha256")
        wheel = first["path"]
        stock = tool("fetch")["path"]
        expected = tree_files()

        venv = Venv(work / "fresh", args.python)
        empty = snapshot(venv.site)
        venv.pip("install", "--no-deps", wheel)
        said = check_is_the_tree(venv, first, expected)
        step(f"fresh venv, pip install --no-deps: {said}")
        shown = [
            line
            for line in venv.show().splitlines()
            if line.split(":", 1)[0] in ("Name", "Version", "Summary", "Location")
        ]
        print("\n".join(f"    pip show sglang: {line}" for line in shown), flush=True)
        tests, which = sampled_tests()
        said = run_carried_tests(venv.site, tests)
        step(f"the fast tests of {which} on that install (not build/sglang): {said}")
        venv.pip("uninstall", "-y", "sglang")
        left = differences(empty, snapshot(venv.site))
        if left:
            raise Failed(f"pip uninstall left {', '.join(left[:10])}")
        step("pip uninstall -y sglang: no file left")

        venv.pip("install", "--no-deps", stock)
        plain = snapshot(venv.site)
        if venv.version() != first["release"]:
            raise Failed(f"the stock release installed as {venv.version()}")
        # Over the stock release as the image's wheel mode puts it there: its
        # pip install --no-deps, from a folder with a decoy beside the wheel.
        said = install_fork_prebuilt(venv, Path(wheel), work / "prebuilt")
        said += "; " + check_is_the_tree(venv, first, expected)
        step(f"over a stock install, by install-fork.sh --mode wheel: {said}")
        venv.pip("uninstall", "-y", "sglang")
        venv.pip("install", "--no-deps", stock)
        changed = differences(plain, snapshot(venv.site))
        if changed:
            raise Failed(
                f"stock reinstalled, but these differ: {', '.join(changed[:10])}"
            )
        step(
            f"uninstall + stock reinstall: sglang {venv.version()}, every file stock's"
        )
    except Failed as exc:
        step(f"FAILED: {exc}")
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    step("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
