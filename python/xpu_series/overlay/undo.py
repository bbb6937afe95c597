"""Undo an overlay: the same journal, with the saved originals as its entries."""

from __future__ import annotations

from pathlib import Path

from xpu_series.errors import TreeError
from xpu_series.fork.identity import PLUGIN_MODULE
from xpu_series.overlay.installed import (
    PROVENANCE,
    OverlayReport,
    changed_since,
    find_install,
    read_provenance,
)
from xpu_series.overlay.write import recover, run_journal


def run_undo(site: Path, force: bool = False) -> OverlayReport:
    """Give back every original byte the overlay replaced (after any journal)."""
    repaired = recover(site.resolve()) if site.is_dir() else ""
    install = find_install(site)
    report = OverlayReport(
        str(install.site), "undo", release=install.release, repaired=repaired
    )
    prov = read_provenance(install)
    if prov is None:
        report.version = install.version
        return report
    changed = changed_since(install, prov)
    if changed and not force:
        raise TreeError(
            "these files changed since the overlay, and undo would discard that: "
            + ", ".join(changed),
            hint="copy what you want to keep elsewhere, then run 'xpu-series "
            f"overlay --undo --force --into {install.site}'",
        )
    state = install.rel(install.state_dir)
    prune = [state]
    entries: list[tuple[str, bytes | None]] = []
    added = list(prov.get("added", []))  # an overlay of an older tool has none
    for rel in [*prov["files"], *added]:
        if rel not in prov["originals"]:
            entries.append((rel, None))
    if PLUGIN_MODULE in added:
        # Python caches the module's bytecode once sglang has loaded it: that
        # goes with the module, and the package's folder once it is empty.
        package = (install.site / PLUGIN_MODULE).parent
        entries += [
            (install.rel(path), None)
            for path in sorted(package.glob("__pycache__/__init__.*.pyc"))
        ]
        prune.append(install.rel(package))
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
    run_journal(install.site, "undo", entries, prune=prune)
    report.changed = True
    report.provenance = prov
    report.version = prov["installed_version"]
    return report
