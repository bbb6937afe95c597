"""Check test registration with sglang's own collector: every test file
(test_*.py) under test/registered/ registers (with a __main__ block), and
test/manual/ registers nothing (upstream convention). Other modules there are
the tests' helpers."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from sglang.test.ci.ci_register import collect_tests

ROOT = Path(__file__).resolve().parents[1]
_REGISTER_CALL = re.compile(r"^\s*register_\w+_ci\(", re.MULTILINE)


def main() -> int:
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
