"""The installed sglang an overlay works on: found, its provenance read, its status."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpu_series.errors import UsageError

JOURNAL = ".xpu-series-journal"
STATE_DIR = "xpu_series"  # inside the dist-info, so pip uninstall removes it
PROVENANCE = "overlay.json"


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


def read_provenance(install: Install) -> dict[str, Any] | None:
    path = install.state_dir / PROVENANCE
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def file_bytes(site: Path, rel: str) -> bytes | None:
    path = site / rel
    return path.read_bytes() if path.is_file() else None


def changed_since(install: Install, prov: dict[str, Any]) -> list[str]:
    """Files of the overlay that no longer hold the bytes it wrote."""
    changed = []
    for rel, facts in prov["files"].items():
        data = file_bytes(install.site, rel)
        now = "" if data is None else sha256_bytes(data)
        if now != facts["sha256"]:
            changed.append(rel)
    return changed


def read_status(site: Path) -> OverlayReport:
    """What is installed in `site`: the release, and the overlay's record if any."""
    install = find_install(site)
    report = OverlayReport(str(install.site), "status", release=install.release)
    report.version = install.version
    if (install.site / JOURNAL).exists():
        report.repaired = "pending"
    prov = read_provenance(install)
    report.provenance = prov
    if prov is not None:
        changed = set(changed_since(install, prov))
        report.files = [
            {
                "path": rel,
                "state": "changed since the overlay" if rel in changed else "intact",
                **facts,
            }
            for rel, facts in sorted(prov["files"].items())
        ]
    return report
