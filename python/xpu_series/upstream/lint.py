"""Upstream's lint hooks (versions kept as data in upstream/conventions.toml),
installed into the cache with pip and run directly on an export's files."""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpu_series.errors import NetworkError
from xpu_series.git import run_command

CONVENTIONS = Path(__file__).with_name("conventions.toml")
_CODESPELL_LINE = re.compile(r"^(?P<path>.+?):(?P<line>\d+): ")


@dataclass(frozen=True)
class Hook:
    """One pre-commit hook of upstream's, as we run it."""

    id: str
    package: str
    version: str
    check: tuple[str, ...]
    fix: tuple[str, ...] | None = None
    module: str = ""
    program: str = ""
    added_lines_only: bool = False
    python_only: bool = False

    def files(self, paths: list[str]) -> list[str]:
        return [p for p in paths if p.endswith(".py")] if self.python_only else paths

    @property
    def pin(self) -> str:
        return f"{self.package}=={self.version}"

    def to_json(self) -> dict[str, str]:
        return {"id": self.id, "package": self.package, "version": self.version}


@dataclass
class LintResult:
    """What the hooks said of an export's files: one entry per hook that spoke."""

    hooks: list[Hook]
    findings: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.findings

    def to_json(self) -> dict[str, Any]:
        return {
            "hooks": [h.to_json() for h in self.hooks],
            "findings": dict(self.findings),
            "ok": self.ok,
        }


def load_conventions(path: Path = CONVENTIONS) -> dict[str, Any]:
    with path.open("rb") as f:
        return tomllib.load(f)


def load_hooks(path: Path = CONVENTIONS) -> list[Hook]:
    """The hooks, in the order upstream's config runs them."""
    hooks = []
    for raw in load_conventions(path)["hook"]:
        fix = raw.get("fix")
        hooks.append(
            Hook(
                id=raw["id"],
                package=raw["package"],
                version=raw["version"],
                check=tuple(raw["check"]),
                fix=tuple(fix) if fix is not None else None,
                module=raw.get("module", ""),
                program=raw.get("program", ""),
                added_lines_only=bool(raw.get("added-lines-only", False)),
                python_only=bool(raw.get("python-only", False)),
            )
        )
    return hooks


def hook_folder(cache: Path, hook: Hook) -> Path:
    return cache / "upstream-hooks" / f"{hook.package}-{hook.version}"


def install_hooks(hooks: list[Hook], cache: Path) -> list[str]:
    """pip-install each pinned package into its own cache folder once; the pins
    installed by this call."""
    done: list[str] = []
    for hook in hooks:
        folder = hook_folder(cache, hook)
        if (folder / ".complete").is_file():
            continue
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=cache))
        try:
            result = run_command(
                [sys.executable, "-m", "pip", "install", "-q",
                 "--disable-pip-version-check", "--no-warn-script-location",
                 "--target", str(staging), hook.pin],
            )  # fmt: skip
            if not result.ok:
                tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
                raise NetworkError(
                    f"pip could not install upstream's lint hook {hook.pin}: "
                    + " / ".join(tail),
                    hint="check that PyPI is reachable, then run the same command "
                    "again (the hooks are cached in build/cache/upstream-hooks/)",
                )
            (staging / ".complete").write_text(hook.pin + "\n")
            folder.parent.mkdir(parents=True, exist_ok=True)
            if folder.exists():
                shutil.rmtree(folder)
            os.replace(staging, folder)
            done.append(hook.pin)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return done


def _argv(hook: Hook, cache: Path, args: tuple[str, ...]) -> list[str]:
    folder = hook_folder(cache, hook)
    if hook.program:
        return [str(folder / hook.program), *args]
    return [sys.executable, "-m", hook.module, *args]


def _env(hook: Hook, cache: Path) -> dict[str, str]:
    return {"PYTHONPATH": str(hook_folder(cache, hook)), "PYTHONNOUSERSITE": "1"}


def format_files(folder: Path, paths: list[str], cache: Path) -> None:
    """Run every fixing hook on `paths` (relative to `folder`), in place."""
    hooks = load_hooks()
    install_hooks(hooks, cache)
    for hook in hooks:
        if hook.fix is None:
            continue
        files = hook.files(paths)
        if files:
            run_command(
                _argv(hook, cache, (*hook.fix, *files)),
                cwd=folder,
                env=_env(hook, cache),
            )


def lint_files(
    folder: Path,
    paths: list[str],
    cache: Path,
    added: dict[str, set[int]] | None = None,
) -> LintResult:
    """Each hook in check mode on copies of `paths`: a hook speaks when it exits
    non-zero or would change a file. `added`: per path, the lines the export adds
    (a hook marked added-lines-only reports nothing else)."""
    hooks = load_hooks()
    install_hooks(hooks, cache)
    result = LintResult(hooks)
    with tempfile.TemporaryDirectory(prefix="xpu-upstream-lint-") as tmp:
        scratch = Path(tmp)
        for hook in hooks:
            files = [p for p in hook.files(paths) if (folder / p).is_file()]
            if not files:
                continue
            for rel in files:
                dest = scratch / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(folder / rel, dest)
            ran = run_command(
                _argv(hook, cache, (*hook.check, *files)),
                cwd=scratch,
                env=_env(hook, cache),
            )
            changed = [
                rel
                for rel in files
                if (scratch / rel).read_bytes() != (folder / rel).read_bytes()
            ]
            text = (ran.stdout + ran.stderr).strip()
            if hook.added_lines_only:
                text = _only_added(text, added or {})
                failed = bool(text)
            else:
                failed = not ran.ok or bool(changed)
            if failed:
                if changed and not text:
                    text = "would change: " + ", ".join(changed)
                result.findings[hook.id] = text or f"exit code {ran.returncode}"
    return result


def _only_added(text: str, added: dict[str, set[int]]) -> str:
    """The lines of a `path:line: ...` report that fall on added lines."""
    kept = []
    for line in text.splitlines():
        match = _CODESPELL_LINE.match(line)
        if match is None:
            continue
        lines = added.get(match.group("path"))
        if lines is None or int(match.group("line")) in lines:
            kept.append(line)
    return "\n".join(kept)


def added_lines(diff: str) -> dict[str, set[int]]:
    """Per file, the new-side line numbers a unified diff adds.

    >>> added_lines("+++ b/a.py\\n@@ -1,0 +2,2 @@\\n+x\\n+y\\n")
    {'a.py': {2, 3}}
    """
    out: dict[str, set[int]] = {}
    path = ""
    line = 0
    for raw in diff.splitlines():
        if raw.startswith("+++ "):
            name = raw[4:].split("\t")[0]
            path = name[2:] if name.startswith("b/") else ""
            continue
        hunk = re.match(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@", raw)
        if hunk:
            line = int(hunk.group(1))
            continue
        if not path or raw.startswith(("--- ", "diff ", "index ")):
            continue
        if raw.startswith("+"):
            out.setdefault(path, set()).add(line)
            line += 1
        elif raw.startswith(" "):
            line += 1
    return out
