"""Write the series into an installed sglang (a site-packages folder), all or nothing.

Where models are served, sglang is an installed distribution (the XPU image builds it
from its release tag), not our git tree. The overlay checks that each file the series
touches is byte for byte the release's (by the blob ids the patch files carry), works
out every post-image in memory, and only then writes, through a journal:

1. every final byte (patched files, the originals' copies, METADATA, RECORD, the
   provenance record) is staged in `SITE/.xpu-series-journal.new/`;
2. renaming that folder to `.xpu-series-journal` is the commit point;
3. each entry is written beside its target and renamed in; the journal goes last.

A run that finds a journal finishes it first, so an interrupt at any moment ends,
after the next run or `--undo`, in the original install or the complete overlay.
`--undo` is the same journal with the originals as its entries.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpu_series import __version__
from xpu_series.errors import IntegrityError, TreeError, UsageError
from xpu_series.project import Project
from xpu_series.stack.hunks import FileDiff, apply_diff, parse_patch, same_blob
from xpu_series.stack.pin import Pin, version_tuple
from xpu_series.stack.series import Series

JOURNAL = ".xpu-series-journal"
# The series as it applies to each served release other than the pin (its patch
# files carry the pin's blob ids; an older release's files differ).
RELEASE_DIFFS = "overlay"
_SERIES_LINE = "# Series-SHA256: "
STATE_DIR = "xpu_series"  # inside the dist-info, so pip uninstall removes it
PROVENANCE = "overlay.json"
LABEL = "xpu"


@dataclass(frozen=True)
class Install:
    """One installed sglang: its site folder, dist-info and recorded version."""

    site: Path
    dist_info: Path
    version: str

    @property
    def release(self) -> str:
        """The upstream release, without a local label (`0.5.23+xpu.s1` -> 0.5.23)."""
        return self.version.split("+", 1)[0]

    @property
    def record(self) -> Path:
        return self.dist_info / "RECORD"

    @property
    def metadata(self) -> Path:
        return self.dist_info / "METADATA"

    @property
    def state_dir(self) -> Path:
        return self.dist_info / STATE_DIR

    def rel(self, path: Path) -> str:
        return path.relative_to(self.site).as_posix()


@dataclass
class OverlayReport:
    """What an overlay, an undo or a status read found or did."""

    site: str
    action: str
    release: str = ""
    version: str = ""
    changed: bool = False
    provenance: dict[str, Any] | None = None
    files: list[dict[str, str]] = field(default_factory=list)
    repaired: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": True,
            "site": self.site,
            "action": self.action,
            "release": self.release,
            "version": self.version,
            "changed": self.changed,
            "repaired": self.repaired,
            "provenance": self.provenance,
            "files": self.files,
        }


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def record_hash(data: bytes) -> str:
    """RECORD's hash form: `sha256=` and the urlsafe base64 digest, unpadded."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest())
    return "sha256=" + digest.rstrip(b"=").decode()


def python_site(python: str) -> Path:
    """The folder holding the `sglang` package that `python` would import."""
    code = (
        "import importlib.util, os\n"
        "s = importlib.util.find_spec('sglang')\n"
        "print(os.path.dirname(list(s.submodule_search_locations)[0]) if s else '')\n"
    )
    try:
        proc = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(
            f"cannot run {python}: {exc}", hint="name a Python with --python PATH"
        ) from None
    where = proc.stdout.strip()
    if proc.returncode != 0 or not where:
        raise UsageError(
            f"{python} does not import sglang",
            hint="install sglang into that Python first, or name its "
            "site-packages folder with --into",
        )
    return Path(where)


def _metadata_field(text: str, name: str) -> str:
    for line in text.splitlines():
        if not line.strip():
            break  # the headers end at the first blank line
        key, _, value = line.partition(":")
        if key.strip().lower() == name.lower():
            return value.strip()
    return ""


def find_install(site: Path) -> Install:
    """The sglang installed in `site`; a usage error names what is missing."""
    site = site.resolve()
    if not site.is_dir():
        raise UsageError(f"{site} is not a folder", hint=_SITE_HINT)
    if not (site / "sglang" / "__init__.py").is_file():
        raise UsageError(f"{site} holds no installed sglang package", hint=_SITE_HINT)
    found = []
    for dist in sorted(site.glob("*.dist-info")):
        meta = dist / "METADATA"
        if not meta.is_file():
            continue
        text = meta.read_text(encoding="utf-8", errors="replace")
        if _metadata_field(text, "Name").lower().replace("_", "-") == "sglang":
            found.append(Install(site, dist, _metadata_field(text, "Version")))
    if not found:
        raise UsageError(
            f"{site} has sglang/ but no sglang-*.dist-info: it is not an installed "
            "distribution (a source tree or an editable install?)",
            hint="patch a source tree with 'xpu-series apply'; overlay is for "
            "an sglang installed by pip",
        )
    if len(found) > 1:
        names = ", ".join(i.dist_info.name for i in found)
        raise UsageError(
            f"{site} holds more than one sglang dist-info ({names})",
            hint="reinstall sglang with pip so one remains",
        )
    return found[0]


_SITE_HINT = (
    "--into names the site-packages folder that holds sglang/ (or pass "
    "--python PATH to use the one that Python imports)"
)


# -- the journal ------------------------------------------------------------------


def _journal(site: Path) -> Path:
    return site / JOURNAL


def _write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _stage_entry(staging: Path, index: int, data: bytes) -> str:
    name = f"{index:05d}"
    _write_file(staging / "data" / name, data)
    return name


def _write_entry(site: Path, rel: str, data: bytes | None) -> None:
    """Put one journal entry in place: beside its target, then renamed in."""
    target = site / rel
    if data is None:
        target.unlink(missing_ok=True)
        return
    mode = target.stat().st_mode & 0o7777 if target.exists() else 0o644
    tmp = target.with_name(f".{target.name}.xpu-series-tmp")
    _write_file(tmp, data)
    os.chmod(tmp, mode)
    os.replace(tmp, target)


def _commit_journal(staging: Path, journal: Path) -> None:
    os.replace(staging, journal)


@contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT/SIGTERM while the journal is replayed (a short, bounded write);
    deliver them after, so Ctrl-C never leaves the install half written."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for sig in old:
        signal.signal(sig, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        for sig in pending:
            os.kill(os.getpid(), sig)


def _replay(site: Path) -> str:
    """Finish the journal in `site` (idempotent); returns its action or ''."""
    journal = _journal(site)
    for leftover in (site / f"{JOURNAL}.new", site / f"{JOURNAL}.done"):
        # Never committed (.new) or already replayed (.done): nothing to redo.
        if leftover.exists():
            shutil.rmtree(leftover)
    plan_file = journal / "journal.json"
    if not plan_file.is_file():
        if journal.exists():
            shutil.rmtree(journal)
        return ""
    plan = json.loads(plan_file.read_text(encoding="utf-8"))
    with _signals_held():
        for entry in plan["entries"]:
            data = entry["data"]
            _write_entry(
                site,
                entry["path"],
                None if data is None else (journal / "data" / data).read_bytes(),
            )
        for rel in plan.get("prune", []):
            _prune_empty(site / rel)
        done = site / f"{JOURNAL}.done"
        os.replace(journal, done)
        shutil.rmtree(done)
    return str(plan["action"])


def _prune_empty(folder: Path) -> None:
    if not folder.is_dir():
        return
    for path in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_dir() and not any(path.iterdir()):
            path.rmdir()
    if not any(folder.iterdir()):
        folder.rmdir()


def _check_writable(site: Path, rels: list[str]) -> None:
    folders = {site} | {(site / rel).parent for rel in rels}
    for folder in sorted(folders):
        probe = folder
        while not probe.exists():
            probe = probe.parent
        if not os.access(probe, os.W_OK):
            raise TreeError(
                f"{probe} is not writable: nothing was written",
                hint="run as a user who can write to the install (in the image: "
                "root), then run the same command again",
            )


def _run_journal(
    site: Path, action: str, entries: list[tuple[str, bytes | None]], prune: list[str]
) -> None:
    _check_writable(site, [rel for rel, _ in entries])
    staging = site / f"{JOURNAL}.new"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    listed = []
    for index, (rel, data) in enumerate(entries):
        name = None if data is None else _stage_entry(staging, index, data)
        listed.append({"path": rel, "data": name})
    plan = {"action": action, "entries": listed, "prune": prune}
    _write_file(staging / "journal.json", json.dumps(plan, indent=1).encode())
    _commit_journal(staging, _journal(site))
    _replay(site)


# -- what the overlay writes ------------------------------------------------------


def _install_path(pin: Pin, tree_path: str) -> str | None:
    """Where a tree path of the series lives in an install (the layout, inverted)."""
    for source, target in pin.layout:
        if tree_path.startswith(target):
            return source + tree_path[len(target) :]
    return None


def _served(project: Project, release: str) -> bool:
    have = version_tuple(release)
    pin = version_tuple(project.pin.version)
    low = version_tuple(project.pin.serves_from or project.pin.version)
    return (
        have is not None and pin is not None and low is not None and low <= have <= pin
    )


def release_diff_path(project: Project, release: str) -> Path:
    return project.patches_dir / RELEASE_DIFFS / f"{release}.diff"


def _diffs(
    project: Project, series: Series, release: str
) -> list[tuple[str, FileDiff]]:
    """Each file diff the overlay applies, in order, with the name it came from.

    On the pin: the patch files themselves. On an older served release: the
    exported diff of the series as applied there, which must be of this series."""
    if release == project.pin.version:
        return [
            (patch.name, diff)
            for patch in series.patches
            for diff in parse_patch(patch.text, patch.name)
        ]
    path = release_diff_path(project, release)
    rel = path.relative_to(project.root).as_posix()
    hint = f"run 'xpu-series overlay --export {release}' and commit {rel}"
    if not path.is_file():
        raise IntegrityError(f"{rel} does not exist: nothing was written", hint=hint)
    text = path.read_text(encoding="utf-8")
    recorded = next(
        (line[len(_SERIES_LINE) :] for line in text.splitlines()
         if line.startswith(_SERIES_LINE)),
        "",
    )  # fmt: skip
    if recorded != series.digest():
        raise IntegrityError(
            f"{rel} was exported from another series than patches/ holds now: "
            "nothing was written",
            hint=hint,
        )
    return [(rel, diff) for diff in parse_patch(text, rel)]


def export_text(project: Project, release: str, diff: str) -> str:
    """The committed form of a release's diff: a header naming what it is."""
    series = project.series(release)
    names = ", ".join(p.name for p in series.patches)
    return (
        f"# The sglang-xpu series as it applies to sglang {release}, for\n"
        "# 'xpu-series overlay' onto an install of that release (the patch files\n"
        "# carry the pin's blob ids). Generated by 'xpu-series overlay --export\n"
        f"# {release}'; do not edit.\n"
        f"{_SERIES_LINE}{series.digest()}\n"
        f"# Patches: {names}\n"
        f"{diff}"
    )


def _revision(root: Path) -> tuple[str, bool]:
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if head.returncode != 0:
            return "", False
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "patches"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return head.stdout.strip(), bool(dirty.stdout.strip())
    except (OSError, subprocess.TimeoutExpired):
        return "", False


def local_version(release: str, series_sha256: str) -> str:
    """The PEP 440 version an overlaid install reports: the release plus a local
    label naming the series (`s` keeps the hex from reading as a number).

    >>> local_version("0.5.23", "3f9a" + "0" * 60)
    '0.5.23+xpu.s3f9a00000000'
    """
    return f"{release}+{LABEL}.s{series_sha256[:12]}"


def _with_version(metadata: bytes, version: str) -> bytes:
    lines = metadata.decode("utf-8").splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.lower().startswith("version:"):
            end = "\r\n" if line.endswith("\r\n") else "\n"
            lines[i] = f"Version: {version}{end}"
            break
        if not line.strip():
            break
    return "".join(lines).encode("utf-8")


def _new_record(record: bytes, rows: dict[str, bytes], drop: set[str]) -> bytes:
    """RECORD with each written file's hash and size, new files added, `drop` gone."""
    reader = csv.reader(io.StringIO(record.decode("utf-8")))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    seen = set()
    record_row = None
    for row in reader:
        if not row:
            continue
        path = row[0]
        if path in drop:
            continue
        if path.endswith("/RECORD") or path == "RECORD":
            record_row = row
            continue
        if path in rows:
            data = rows[path]
            row = [path, record_hash(data), str(len(data))]
            seen.add(path)
        writer.writerow(row)
    for path in sorted(set(rows) - seen):
        data = rows[path]
        writer.writerow([path, record_hash(data), str(len(data))])
    if record_row is not None:
        writer.writerow([record_row[0], "", ""])
    return out.getvalue().encode("utf-8")


def _read_provenance(install: Install) -> dict[str, Any] | None:
    path = install.state_dir / PROVENANCE
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def _current(site: Path, rel: str) -> bytes | None:
    path = site / rel
    return path.read_bytes() if path.is_file() else None


def _changed_since(install: Install, prov: dict[str, Any]) -> list[str]:
    """Files of the overlay that no longer hold the bytes it wrote."""
    changed = []
    for rel, facts in prov["files"].items():
        data = _current(install.site, rel)
        now = "" if data is None else sha256_bytes(data)
        if now != facts["sha256"]:
            changed.append(rel)
    return changed


def _recover(site: Path) -> str:
    if not site.is_dir():
        return ""
    return _replay(site)


def run_overlay(
    project: Project,
    site: Path,
    upstream: str | None = None,
    revision: str | None = None,
) -> OverlayReport:
    """Overlay the series onto the sglang in `site`; refuses before writing anything."""
    repaired = _recover(site.resolve()) if site.is_dir() else ""
    install = find_install(site)
    report = OverlayReport(str(install.site), "overlay", repaired=repaired)
    release = install.release
    report.release = release
    if upstream and upstream != release:
        raise IntegrityError(
            f"{install.site} has sglang {release}, not {upstream}: nothing was written",
            hint=f"install sglang {upstream} there, or overlay for {release} "
            f"with --upstream {release}",
        )
    if not _served(project, release):
        low = project.pin.serves_from or project.pin.version
        raise IntegrityError(
            f"the series serves sglang {low} to {project.pin.version}; "
            f"{install.site} has {release}: nothing was written",
            hint=f"install an sglang the series serves, or move the series with "
            f"'xpu-series rebase --onto {release}'",
        )
    series = project.series(release)
    digest = series.digest()
    prov = _read_provenance(install)
    if prov is not None:
        report.provenance = prov
        if prov.get("series_sha256") == digest:
            changed = _changed_since(install, prov)
            if changed:
                raise IntegrityError(
                    "the overlay is installed but these files changed since: "
                    + ", ".join(changed),
                    hint=f"run 'xpu-series overlay --undo --force --into "
                    f"{install.site}', then overlay again",
                )
            report.version = install.version
            return report
        raise TreeError(
            f"{install.site} already has an overlay of another series "
            f"(sha256 {str(prov.get('series_sha256'))[:12]}, "
            f"{', '.join(p['name'] for p in prov.get('patches', []))})",
            hint=f"run 'xpu-series overlay --undo --into {install.site}', then "
            "this overlay again",
        )
    if "+" in install.version:
        raise IntegrityError(
            f"{install.site} has sglang {install.version}: a locally built "
            "version that is not an overlay of ours",
            hint=f"install the sglang {release} release there, then overlay",
        )
    if not install.record.is_file():
        raise TreeError(
            f"{install.dist_info.name} has no RECORD: pip could not uninstall "
            "what the overlay writes, so nothing was written",
            hint="reinstall sglang with pip (so the install has a RECORD), then "
            "run the same overlay again",
        )
    originals: dict[str, bytes | None] = {}
    current: dict[str, bytes | None] = {}
    mismatched: list[str] = []
    diffs = _diffs(project, series, release)
    for patch_name, diff in diffs:
        rel = _install_path(project.pin, diff.path)
        if rel is None:
            raise UsageError(
                f"{patch_name} touches {diff.path}, which an install does not "
                "carry (the pin's [layout] maps no wheel folder to it)"
            )
        if rel not in originals:
            data = _current(install.site, rel)
            originals[rel] = current[rel] = data
            if not same_blob(diff.old_blob, data):
                state = "missing" if data is None else "differs from sglang " + release
                mismatched.append(f"{rel} ({state})")
    if mismatched:
        raise IntegrityError(
            f"{len(mismatched)} file(s) the series patches are not sglang "
            f"{release}'s: " + "; ".join(mismatched) + ". Nothing was written",
            hint="reinstall that sglang release (pip install --force-reinstall "
            f"--no-deps sglang=={release}), then overlay",
        )
    for patch_name, diff in diffs:
        rel = _install_path(project.pin, diff.path) or ""
        current[rel] = apply_diff(diff, current[rel], patch_name)
    report.version = local_version(release, digest)
    rev, dirty = (revision, False) if revision else _revision(project.root)
    state = install.rel(install.state_dir)
    files = {
        rel: {
            "original_sha256": ""
            if originals[rel] is None
            else sha256_bytes(originals[rel] or b""),
            "sha256": "" if data is None else sha256_bytes(data),
        }
        for rel, data in current.items()
    }
    metadata = install.metadata.read_bytes()
    record = install.record.read_bytes()
    new_metadata = _with_version(metadata, report.version)
    saved = {rel: data for rel, data in originals.items() if data is not None}
    saved[install.rel(install.metadata)] = metadata
    saved[install.rel(install.record)] = record
    prov = {
        "format": 1,
        "tool": f"xpu-series {__version__}",
        "release": release,
        "installed_version": install.version,
        "version": report.version,
        "pin": {"version": project.pin.version, "sha256": project.pin.sha256},
        "series_sha256": digest,
        "patches": [
            {
                "name": str(p.name),
                "sha256": sha256_bytes(p.path.read_bytes()),
                "retired": p.retired,
            }
            for p in series.patches
        ],
        "revision": rev,
        "revision_dirty": dirty,
        "files": files,
        "originals": sorted(saved),
    }
    prov_bytes = (json.dumps(prov, indent=2, sort_keys=True) + "\n").encode()
    writes: dict[str, bytes] = {}
    for rel, data in current.items():
        if data is not None:
            writes[rel] = data
    writes[install.rel(install.metadata)] = new_metadata
    for rel, data in saved.items():
        writes[f"{state}/original/{rel}"] = data
    writes[f"{state}/{PROVENANCE}"] = prov_bytes
    deleted = {rel for rel, data in current.items() if data is None}
    new_record = _new_record(record, writes, deleted)
    entries: list[tuple[str, bytes | None]] = [
        (rel, data) for rel, data in writes.items() if not rel.startswith(state)
    ]
    entries = [(f"{state}/original/{r}", d) for r, d in saved.items()] + entries
    entries += [(rel, None) for rel in sorted(deleted)]
    entries.append((f"{state}/{PROVENANCE}", prov_bytes))
    entries.append((install.rel(install.record), new_record))
    _run_journal(install.site, "overlay", entries, prune=[])
    report.changed = True
    report.provenance = prov
    report.files = [{"path": rel, **facts} for rel, facts in sorted(files.items())]
    return report


def describe(project: Project, release: str | None = None) -> dict[str, Any]:
    """What an overlay for `release` (default: the pin) would install, without a
    target: the series' sha256, the version it reports, the patches (for image tags
    and labels)."""
    release = release or project.pin.version
    if not _served(project, release):
        low = project.pin.serves_from or project.pin.version
        raise IntegrityError(
            f"the series serves sglang {low} to {project.pin.version}, not {release}",
            hint=f"name a release from {low} to {project.pin.version}",
        )
    series = project.series(release)
    digest = series.digest()
    return {
        "ok": True,
        "release": release,
        "series_sha256": digest,
        "version": local_version(release, digest),
        "patches": [str(p.name) for p in series.patches],
    }


def run_undo(site: Path, force: bool = False) -> OverlayReport:
    """Give back every original byte the overlay replaced (after any journal)."""
    repaired = _recover(site.resolve()) if site.is_dir() else ""
    install = find_install(site)
    report = OverlayReport(
        str(install.site), "undo", release=install.release, repaired=repaired
    )
    prov = _read_provenance(install)
    if prov is None:
        report.version = install.version
        return report
    changed = _changed_since(install, prov)
    if changed and not force:
        raise TreeError(
            "these files changed since the overlay, and undo would discard that: "
            + ", ".join(changed),
            hint="copy what you want to keep elsewhere, then run 'xpu-series "
            f"overlay --undo --force --into {install.site}'",
        )
    state = install.rel(install.state_dir)
    entries: list[tuple[str, bytes | None]] = []
    for rel in prov["files"]:
        if rel not in prov["originals"]:
            entries.append((rel, None))
    for rel in prov["originals"]:
        data = (install.state_dir / "original" / rel).read_bytes()
        if rel != install.rel(install.record):
            entries.append((rel, data))
    kept = [install.state_dir / "original" / rel for rel in prov["originals"]] + [
        install.state_dir / PROVENANCE
    ]
    entries += [(install.rel(path), None) for path in kept]
    record = (install.state_dir / "original" / install.rel(install.record)).read_bytes()
    entries.append((install.rel(install.record), record))
    _run_journal(install.site, "undo", entries, prune=[state])
    report.changed = True
    report.provenance = prov
    report.version = prov["installed_version"]
    return report


def read_status(site: Path) -> OverlayReport:
    """What is installed in `site`: the release, and the overlay's record if any."""
    install = find_install(site)
    report = OverlayReport(str(install.site), "status", release=install.release)
    report.version = install.version
    if _journal(install.site).exists():
        report.repaired = "pending"
    prov = _read_provenance(install)
    report.provenance = prov
    if prov is not None:
        changed = set(_changed_since(install, prov))
        report.files = [
            {
                "path": rel,
                "state": "changed since the overlay" if rel in changed else "intact",
                **facts,
            }
            for rel, facts in sorted(prov["files"].items())
        ]
    return report
