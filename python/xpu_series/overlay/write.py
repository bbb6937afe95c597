"""Write the series into an installed sglang (a site-packages folder), all or nothing.

Where models are served, sglang is an installed distribution (the XPU image builds it
from its release tag), not our git tree. The overlay checks that each file the series
touches is byte for byte the release's (by the blob ids the patch files carry), works
out every post-image in memory, and only then writes, through a journal:

1. every final byte (patched files, the originals' copies, METADATA, RECORD, the
   provenance record, and the fork wheel's plugin: its module, its entry point and
   the series record it reads) is staged in `SITE/.xpu-series-journal.new/`;
2. renaming that folder to `.xpu-series-journal` is the commit point;
3. each entry is written beside its target and renamed in; the journal goes last.

A run that finds a journal finishes it first, so an interrupt at any moment ends,
after the next run or `--undo`, in the original install or the complete overlay.
`--undo` is the same journal with the originals as its entries.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from xpu_series.errors import IntegrityError, TreeError
from xpu_series.fork.identity import (
    ENTRY_POINTS,
    PLUGIN_MODULE,
    RECORD_NAME,
    describe_series,
    plugin_source,
    record_bytes,
    with_plugin,
)
from xpu_series.overlay.installed import (
    JOURNAL,
    PROVENANCE,
    Install,
    OverlayReport,
    changed_since,
    file_bytes,
    find_install,
    read_provenance,
    sha256_bytes,
)
from xpu_series.overlay.plan import (
    local_version,
    new_record,
    post_images,
    served,
    with_version,
)
from xpu_series.project import Project

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


def run_journal(
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


def recover(site: Path) -> str:
    if not site.is_dir():
        return ""
    return _replay(site)


# -- the overlay ------------------------------------------------------------------


def run_overlay(
    project: Project,
    site: Path,
    upstream: str | None = None,
    revision: str | None = None,
) -> OverlayReport:
    """Overlay the series onto the sglang in `site`; refuses before writing anything."""
    repaired = recover(site.resolve()) if site.is_dir() else ""
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
    if not served(project, release):
        low = project.pin.serves_from or project.pin.version
        raise IntegrityError(
            f"the series serves sglang {low} to {project.pin.version}; "
            f"{install.site} has {release}: nothing was written",
            hint=f"install an sglang the series serves, or move the series with "
            f"'xpu-series rebase --onto {release}'",
        )
    series = project.series(release)
    digest = series.digest()
    prov = read_provenance(install)
    if prov is not None:
        report.provenance = prov
        if prov.get("series_sha256") == digest:
            changed = changed_since(install, prov)
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
    originals, current = post_images(project, install, series, release)
    report.version = local_version(release, digest)
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
    identity = describe_series(project, release, series, revision)
    metadata = install.metadata.read_bytes()
    record = install.record.read_bytes()
    saved = {rel: data for rel, data in originals.items() if data is not None}
    saved[install.rel(install.metadata)] = metadata
    saved[install.rel(install.record)] = record
    plugin = _plugin_files(install, identity, files)
    added: list[str] = []  # none of the release's: undo deletes them
    for rel in sorted(plugin):
        before = file_bytes(install.site, rel)
        if before is None:
            added.append(rel)
        else:
            saved[rel] = before
    prov = {
        **identity,
        "installed_version": install.version,
        "files": files,
        "originals": sorted(saved),
        "added": added,
    }
    prov_bytes = (json.dumps(prov, indent=2, sort_keys=True) + "\n").encode()
    writes: dict[str, bytes] = {}
    for rel, data in current.items():
        if data is not None:
            writes[rel] = data
    writes[install.rel(install.metadata)] = with_version(metadata, report.version)
    writes.update(plugin)
    for rel, data in saved.items():
        writes[f"{state}/original/{rel}"] = data
    writes[f"{state}/{PROVENANCE}"] = prov_bytes
    deleted = {rel for rel, data in current.items() if data is None}
    overlaid_record = new_record(record, writes, deleted)
    entries: list[tuple[str, bytes | None]] = [
        (rel, data) for rel, data in writes.items() if not rel.startswith(f"{state}/")
    ]
    entries = [(f"{state}/original/{r}", d) for r, d in saved.items()] + entries
    entries += [(rel, None) for rel in sorted(deleted)]
    entries.append((f"{state}/{PROVENANCE}", prov_bytes))
    entries.append((install.rel(install.record), overlaid_record))
    run_journal(install.site, "overlay", entries, prune=[])
    report.changed = True
    report.provenance = prov
    report.files = [{"path": rel, **facts} for rel, facts in sorted(files.items())]
    return report


def _plugin_files(
    install: Install, identity: dict[str, Any], files: dict[str, dict[str, str]]
) -> dict[str, bytes]:
    """What registers the series' plugin in the install, as the fork wheel has it:
    the module, the entry point in sglang's own entry_points.txt, and the record
    (with each patched file's sha256) the plugin reads beside it."""
    dist = install.rel(install.dist_info)
    record = {**identity, "files": {rel: f["sha256"] for rel, f in files.items()}}
    record["source"] = {"installed": install.version}
    return {
        PLUGIN_MODULE: plugin_source(),
        f"{dist}/{ENTRY_POINTS}": with_plugin(
            file_bytes(install.site, f"{dist}/{ENTRY_POINTS}")
        ),
        f"{dist}/{RECORD_NAME}": record_bytes(record),
    }
