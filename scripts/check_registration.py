"""Check test registration with sglang's own collector: every test file
(test_*.py) under test/registered/ registers (with a __main__ block), and
test/manual/ registers nothing (upstream convention). Other modules there are
the tests' helpers."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
_REGISTER_CALL = re.compile(r"^\s*register_\w+_ci\(", re.MULTILINE)


def ci_register() -> ModuleType:
    """sglang's collector, loaded from its file: it needs only the standard
    library, and `import sglang.test.ci...` would run sglang's __init__ first
    (torch, transformers: about 6 s of CPU for a module that parses files)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None:
        raise SystemExit(f"error: {sys.executable} cannot import sglang")
    path = Path(spec.origin).parent / "test" / "ci" / "ci_register.py"
    loaded = importlib.util.spec_from_file_location("sglang_ci_register", path)
    assert loaded is not None and loaded.loader is not None
    module = importlib.util.module_from_spec(loaded)
    # dataclasses looks the module up by name while it builds the classes.
    sys.modules[loaded.name] = module
    loaded.loader.exec_module(module)
    return module


def main() -> int:
    collect_tests = ci_register().collect_tests
    registered = sorted(
        str(p) for p in (ROOT / "test" / "registered").rglob("test_*.py")
    )
    try:
        entries = collect_tests(registered, sanity_check=True)
    except Exception as exc:  # the collector raises plain ValueError/Exception
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for entry in entries:
        rel = Path(entry.filename).relative_to(ROOT)
        nightly = " nightly" if entry.nightly else ""
        print(
            f"{rel}: {entry.backend.name.lower()} {entry.effective_suite} "
            f"{entry.est_time:g}s{nightly}"
        )
    manual = [
        p
        for p in (ROOT / "test" / "manual").rglob("*.py")
        if _REGISTER_CALL.search(p.read_text(encoding="utf-8"))
    ]
    for path in manual:
        print(f"error: {path.relative_to(ROOT)} registers for CI", file=sys.stderr)
    print(f"{len(entries)} registrations in {len(registered)} files")
    return 1 if manual else 0


if __name__ == "__main__":
    sys.exit(main())
