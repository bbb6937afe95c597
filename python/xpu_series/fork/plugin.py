"""sglang-xpu's `sglang.srt.plugins` entry point: says which series this sglang runs."""

# The fork wheel ships this file as its own top-level package (`sglang_xpu_series`),
# so it imports nothing but the standard library. SGLang calls `announce()` in every
# server process; a plugin that raises takes that process down, so nothing here may.

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import sys
from pathlib import Path
from typing import Any

RECORD_NAME = "xpu_series.json"  # in the fork's dist-info: the series identity
logger = logging.getLogger("sglang_xpu_series")
# sglang's own log format (configure_logger), for a line logged before it runs.
_FORMAT = "[%(asctime)s] %(message)s"
_DATEFMT = "%Y-%m-%d %H:%M:%S"


def announce() -> None:
    """Log the series, its patch count and the sglang version; warn about the first
    patched file that is not the series' (never raises)."""
    try:
        for level, message in describe(Path(__file__).resolve().parent.parent):
            _emit(level, message)
    except Exception as exc:  # noqa: BLE001 - a raising plugin kills the server
        try:
            _emit(logging.WARNING, f"sglang-xpu: cannot describe the series: {exc!r}")
        except Exception:  # noqa: BLE001
            pass


def describe(site: Path) -> list[tuple[int, str]]:
    """(level, message) lines for the fork installed in `site`."""
    record, where = _find_record(site)
    if record is None:
        return [(logging.WARNING, f"sglang-xpu: no readable {RECORD_NAME} in {where}")]
    sha = str(record.get("series_sha256", ""))
    patches = record.get("patches", [])
    count = len(patches) if isinstance(patches, list) else 0
    lines = [
        (
            logging.INFO,
            f"sglang-xpu: series s{sha[:12]} ({count} patches, series sha256 "
            f"{sha}) on sglang {_sglang_version(record)}",
        )
    ]
    files = record.get("files", {})
    if isinstance(files, dict):
        root = _sglang_root(site)
        differs = _first_difference(root, files)
        if differs:
            lines.append(
                (
                    logging.WARNING,
                    f"sglang-xpu: {differs} in {root}: this sglang is not the "
                    f"series' build (a hand edit or a partial install?); reinstall "
                    "the fork wheel",
                )
            )
    return lines


def _find_record(site: Path) -> tuple[dict[str, Any] | None, str]:
    """The record in a dist-info beside this package (the first readable one)."""
    for path in sorted(site.glob(f"*.dist-info/{RECORD_NAME}")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            return data, str(path)
    return None, str(site)


def _sglang_version(record: dict[str, Any]) -> str:
    """What `pip show sglang` says; the record's version when pip knows none."""
    try:
        return importlib.metadata.version("sglang")
    except Exception:  # noqa: BLE001 - a broken dist-info is not our failure
        return str(record.get("version", "unknown"))


def _sglang_root(site: Path) -> Path:
    """The folder holding the sglang package this process runs (where its
    patched files are), else the fork's own site folder."""
    module = sys.modules.get("sglang")
    locations = list(getattr(module, "__path__", None) or [])
    if not locations:
        spec = importlib.util.find_spec("sglang")
        locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]).parent if locations else site


def _first_difference(root: Path, files: dict[str, Any]) -> str:
    """The first recorded file (by path) whose bytes are not the series'."""
    for rel in sorted(files):
        expected = str(files[rel])
        path = root / rel
        if not expected:
            if path.exists():
                return f"{rel} is there, but the series deletes it"
            continue
        try:
            data = path.read_bytes()
        except OSError:
            return f"{rel} is missing"
        if hashlib.sha256(data).hexdigest() != expected:
            return f"{rel} differs from the series' file"
    return ""


def _emit(level: int, message: str) -> None:
    """Log through the handlers logging has when they would show the line;
    otherwise straight to stderr in sglang's format.

    sglang loads plugins before it configures logging in every process (the
    launcher, scheduler, detokenizer, DP controller): at that point the root
    logger has no handler, or one an import left at WARNING, and an INFO record
    would be dropped. The line is the point of the plugin, so it is written.
    """
    if logger.isEnabledFor(level) and logger.hasHandlers():
        logger.log(level, message)
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_FORMAT, _DATEFMT))
    handler.handle(
        logger.makeRecord(logger.name, level, __file__, 0, message, (), None)
    )
    handler.flush()
