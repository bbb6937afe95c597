"""Replay the series' last move from git history and check it reproduces the
committed patches/ byte for byte.

The move commit is the last one that changed patches/moves/. Its parent's
patches/ is the series as it was; the move commit's patches/moves/*.plan (the
maintainer's decisions) and patches/resolutions/ (hand resolutions, recorded by
rebase) are laid over it, and every recorded rebase is run again in a scratch
copy of the project, in order. The result must equal the move commit's patches/.

Run by scripts/test. Exits 0 with a 'skipped:' line when the package index cannot
be reached; exits 1 when the replay differs or a rebase fails.
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOL = [sys.executable, "-m", "xpu_series"]
RECORD = ("patches/moves/", "patches/resolutions/")


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def _files(commit: str, folder: str = "patches") -> dict[str, bytes]:
    """Every file under `folder` at `commit`, by path."""
    data = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, folder],
        capture_output=True,
        check=True,
    ).stdout
    out: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        for member in archive.getmembers():
            if member.isfile():
                handle = archive.extractfile(member)
                out[member.name] = handle.read() if handle else b""
    return out


def _write(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _plans(files: dict[str, bytes]) -> list[tuple[str, str, str]]:
    """(from, onto, path) of each recorded rebase, oldest first."""
    out = []
    for rel in files:
        name = Path(rel).name
        if rel.startswith("patches/moves/") and name.endswith(".plan"):
            old, _, new = name.removesuffix(".plan").partition("-to-")
            out.append((old, new, rel))

    def key(item: tuple[str, str, str]) -> tuple[int, ...]:
        return tuple(int(p) for p in item[0].split(".") if p.isdigit())

    return sorted(out, key=key)


def _pin_version(files: dict[str, bytes]) -> str:
    for line in files["patches/upstream.toml"].decode().splitlines():
        if line.startswith("version"):
            return line.split("=", 1)[1].strip().strip('"')
    return ""


def _run(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, XPU_SERIES_CACHE=str(ROOT / "build" / "cache"))
    return subprocess.run(
        [*TOOL, "-C", str(project), *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--commit", help="the move commit (default: the last to change patches/moves)"
    )
    args = parser.parse_args()
    move = args.commit or _git("log", "-1", "--format=%H", "--", "patches/moves")
    if not move:
        print("skipped: no recorded move (patches/moves/) in this history")
        return 0
    after = _files(move)
    before = _files(f"{move}^")
    start = _pin_version(before)
    # The rebases this commit recorded (older plans came with earlier moves).
    plans = [p for p in _plans(after) if p[2] not in before]
    if not plans or plans[0][0] != start:
        print(
            f"error: {move[:12]} records no rebase from sglang {start}", file=sys.stderr
        )
        return 1
    print(
        f"replaying {move[:12]}: sglang {start} -> " + " -> ".join(p[1] for p in plans)
    )
    with tempfile.TemporaryDirectory(prefix="xpu-replay-") as tmp:
        project = Path(tmp)
        _write(project, before)
        _write(project, {k: v for k, v in after.items() if k.startswith(RECORD)})
        (project / "pyproject.toml").write_bytes((ROOT / "pyproject.toml").read_bytes())
        steps = [("apply",)] + [
            ("rebase", "--onto", new, "--plan", str(project / rel), "--no-test-retired")
            for _old, new, rel in plans
        ]
        for step in steps:
            started = time.monotonic()
            proc = _run(project, *step)
            if (
                proc.returncode != 0
                and "could not reach the package index" in proc.stderr
            ):
                print(
                    f"skipped: the package index cannot be reached ({' '.join(step)})"
                )
                return 0
            print(f"  {' '.join(step[:3])}: exit {proc.returncode} "
                  f"({time.monotonic() - started:.0f} s)")  # fmt: skip
            if proc.returncode != 0:
                print(proc.stdout + proc.stderr, file=sys.stderr)
                print(
                    f"error: '{' '.join(step)}' failed in the replay", file=sys.stderr
                )
                return 1
        got = {
            str(p.relative_to(project)): p.read_bytes()
            for p in sorted((project / "patches").rglob("*"))
            if p.is_file()
        }
    differ = sorted(k for k in set(got) | set(after) if got.get(k) != after.get(k))
    for rel in differ:
        state = (
            "missing" if rel not in got else "extra" if rel not in after else "differs"
        )
        print(f"error: {rel} {state} in the replay", file=sys.stderr)
    if differ:
        print(
            "hint: the tool no longer reproduces the recorded move: fix the tool, or "
            "redo the move and commit its patches/",
            file=sys.stderr,
        )
        return 1
    print(f"ok: the replay reproduces the {len(after)} files of patches/ at "
          f"{move[:12]} byte for byte")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
