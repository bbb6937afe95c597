#!/usr/bin/env python3
"""CI: the fork installed the way the XPU image gets it, on a real pip install.

For the pin and each other release the series serves: the sglang wheel is installed
with pip into a scratch virtualenv, `docker/install-fork.sh` (what docker/Dockerfile
runs) overlays it, and then:
- on the pin, the fast tests (`Fast-Tests:`, else `Tests:`) of the run's seeded
  sample of the carried patches (the proofs' sample: XPU_SERIES_PROOF_SEED, and
  every patch with XPU_SERIES_PROVE_ALL=1, as the weekly workflow runs) run
  against that installed, overlaid sglang (and it is checked that they imported
  it from there). The sample shows the install imports and runs; that the
  overlaid files are the series' is checked for every file (overlay --status),
  and every patch's tests pass on those same bytes in the `registered` step;
- the overlay registers the series' plugin: importlib.metadata finds its
  `sglang.srt.plugins` entry point in the site, and its module is there;
- `overlay --undo` gives back every file's original sha256, and the entry point
  and the plugin's package are gone;
- after a second overlay, `pip uninstall sglang` still removes every file;
- on an older release, patches/overlay/<release>.diff is what `overlay --export`
  writes from the series.
Prints one line per release with its time. Exit 0 only when every check held.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = ROOT / ".venv" / "bin" / "python"
TOOL = ROOT / ".venv" / "bin" / "xpu-series"
sys.path.insert(0, str(ROOT / "python"))

from xpu_series.fork.identity import (  # noqa: E402
    PLUGIN_GROUP,
    PLUGIN_MODULE,
    PLUGIN_NAME,
    PLUGIN_PACKAGE,
)
from xpu_series.project import Project  # noqa: E402
from xpu_series.proofs.record import (  # noqa: E402
    SEED_ENV,
    prove_all_asked,
    run_seed,
    sample,
    sample_size,
)
from xpu_series.stack.bytecode import prime_folder  # noqa: E402


class Failed(Exception):
    """One check did not hold; the message says which."""


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if proc.returncode != 0:
        raise Failed(
            f"{' '.join(map(str, cmd))} exited {proc.returncode}\n"
            f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        )
    return proc


def snapshot(site: Path) -> dict[str, str]:
    return {
        p.relative_to(site).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(site.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def served_releases() -> list[str]:
    pin = tomllib.loads((ROOT / "patches/upstream.toml").read_text())["upstream"]
    low = tuple(int(x) for x in pin.get("serves-from", pin["version"]).split("."))
    high = tuple(int(x) for x in pin["version"].split("."))
    return [
        ".".join(map(str, (*high[:-1], n)))
        for n in range(low[-1], high[-1] + 1)
        if low[:-1] == high[:-1]
    ]


def sampled_tests() -> tuple[list[str], str]:
    """The fast tests the install runs: those of the run's sample of patches
    (proofs/record.py's, by the run's seed), or every patch's when all are to be
    proven; and which patches they are."""
    patches = [p for p in Project(ROOT).series().patches if p.header.fast_tests]
    if prove_all_asked():
        chosen, why = patches, "every patch"
    else:
        seed = run_seed()
        names = sample(seed, [p.name for p in patches], sample_size())
        chosen = [p for p in patches if p.name in names]
        why = (
            f"{', '.join(n[:4] for n in names)} (a sample: {SEED_ENV}={seed} "
            "repeats it, XPU_SERIES_PROVE_ALL=1 runs every patch's)"
        )
    tests: list[str] = []
    for patch in chosen:
        tests += [t for t in patch.header.fast_tests if t not in tests]
    return tests, why


def run_carried_tests(site: Path, tests: list[str]) -> str:
    """Run `tests` with the project's Python against the sglang installed in
    `site` (checked to be the one they import, not build/sglang); pytest's
    summary line."""
    # pip may have installed without compiling; the pin's files are the primed
    # build/sglang's, so their .pyc are cached.
    prime_folder(site / "sglang", Project(ROOT).cache_dir)
    env = dict(os.environ, PYTHONPATH=str(site))
    # Where `import sglang` would load it from, without running its __init__
    # (torch and the rest: seconds of CPU the tests below pay anyway).
    find = "import importlib.util as u; print(u.find_spec('sglang').origin)"
    where = run([str(PY), "-c", find], env=env)
    if not where.stdout.strip().startswith(str(site)):
        raise Failed(f"the tests would import sglang from {where.stdout.strip()}")
    proc = run(
        [str(PY), "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        env=env,
        cwd=ROOT,
    )
    return proc.stdout.strip().splitlines()[-1]


def plugin_registered(site: Path) -> str:
    """'' when `site` registers the series' plugin (its entry point, as
    importlib.metadata finds it from `site` alone, and its module); else what
    is missing."""
    code = (
        "import importlib.metadata as m, sys\n"
        "found = m.entry_points(group=sys.argv[1], name=sys.argv[2])\n"
        "print(''.join(ep.value for ep in found))\n"
    )
    found = run(
        [sys.executable, "-S", "-c", code, PLUGIN_GROUP, PLUGIN_NAME],
        env=dict(os.environ, PYTHONPATH=str(site)),
    ).stdout.strip()
    if found != f"{PLUGIN_PACKAGE}:announce":
        return f"entry point {PLUGIN_GROUP} {PLUGIN_NAME} is {found or 'missing'}"
    if not (site / PLUGIN_MODULE).is_file():
        return f"{PLUGIN_MODULE} is missing"
    return ""


def fetch(release: str) -> Path | None:
    proc = subprocess.run(
        [str(TOOL), "--json", "fetch", "--upstream", release],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        if "could not reach the package index" in proc.stderr:
            return None
        raise Failed(f"fetch {release}: {proc.stderr.strip()}")
    return Path(json.loads(proc.stdout)["path"])


def check_release(release: str, wheel: Path, work: Path, tests: list[str]) -> str:
    shutil.rmtree(work, ignore_errors=True)
    venv = work / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    vpy = venv / "bin" / "python"
    pip = [str(PY), "-m", "pip", "--disable-pip-version-check", "-q"]
    run(
        [*pip, "--python", str(vpy), "install", "--no-deps", "--no-compile", str(wheel)]
    )
    site = Path(
        run(
            [
                str(vpy),
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            ]
        ).stdout.strip()
    )
    before = snapshot(site)
    run(
        [str(ROOT / "docker/install-fork.sh"), "--python", str(vpy), "--upstream",
         release, "--bin", str(work / "bin")]
    )  # fmt: skip
    launcher = str(work / "bin" / "xpu-series")
    status = json.loads(
        run([launcher, "--json", "overlay", "--status", "--python", str(vpy)]).stdout
    )
    if not status["provenance"] or {f["state"] for f in status["files"]} != {"intact"}:
        raise Failed(f"{release}: overlay --status does not show an intact overlay")
    done = [f"{len(status['files'])} files, version {status['version']}"]
    plugin = plugin_registered(site)
    if plugin:
        raise Failed(f"{release}: after the overlay, {plugin}")
    done.append("plugin registered")
    if tests:
        done.append(run_carried_tests(site, tests))
    run([launcher, "overlay", "--undo", "--python", str(vpy)])
    if not plugin_registered(site) or (site / PLUGIN_PACKAGE).exists():
        raise Failed(f"{release}: after --undo, the plugin is still there")
    after = snapshot(site)
    if after != before:
        diff = sorted(
            k for k in before.keys() | after.keys() if before.get(k) != after.get(k)
        )
        raise Failed(f"{release}: --undo left files different: {', '.join(diff[:10])}")
    done.append(f"undo: {len(before)} files back to their sha256")
    run([launcher, "overlay", "--python", str(vpy), "--upstream", release])
    run([*pip, "--python", str(vpy), "uninstall", "-y", "sglang"])
    left = [p for p in site.iterdir() if p.name.startswith("sglang")]
    if left:
        raise Failed(f"{release}: pip uninstall left {', '.join(p.name for p in left)}")
    done.append("pip uninstall: nothing left")
    return "; ".join(done)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("releases", nargs="*", help="default: every served release")
    parser.add_argument("--work", default=str(ROOT / "build" / "overlay"))
    args = parser.parse_args()
    pin = tomllib.loads((ROOT / "patches/upstream.toml").read_text())["upstream"]
    releases = args.releases or served_releases()
    tests, which = sampled_tests()
    print(f"the pin's install runs the fast tests of {which}", flush=True)
    failed = 0
    for release in releases:
        start = time.monotonic()
        try:
            wheel = fetch(release)
            if wheel is None:
                print(f"{release}: skipped, the package index cannot be reached")
                continue
            if release != pin["version"]:
                # The committed diff of that release must be what export writes.
                run([str(TOOL), "overlay", "--export", release, "--check"])
            said = check_release(
                release,
                wheel,
                Path(args.work) / release,
                tests if release == pin["version"] else [],
            )
            print(f"{release}: ok in {time.monotonic() - start:.1f} s: {said}")
        except Failed as exc:
            failed += 1
            print(f"{release}: FAILED in {time.monotonic() - start:.1f} s: {exc}")
        sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
