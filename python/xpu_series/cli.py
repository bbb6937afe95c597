"""xpu-series: apply, check and maintain the sglang-xpu patch series on a pinned
upstream SGLang."""

# This is the only module that prints or exits. Each verb lives in its own module
# under commands/ (arguments, logic and rendering); this file only wires them up.

from __future__ import annotations

import argparse
import errno
import functools
import importlib
import json
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from xpu_series import __version__
from xpu_series.commands import VERBS, Context, Output
from xpu_series.errors import XpuSeriesError
from xpu_series.result import ExitCode


def verb_module(verb: str) -> ModuleType:
    """`commands/<verb>.py` (a dash in the verb is an underscore in the module)."""
    return importlib.import_module(f"xpu_series.commands.{verb.replace('-', '_')}")


@functools.cache
def build_parser() -> argparse.ArgumentParser:
    """The CLI's parser, built once per process (parsing leaves it as it was;
    the tool's tests call `main` a thousand times)."""
    parser = argparse.ArgumentParser(
        prog="xpu-series",
        description=(__doc__ or "").split("\n\n")[0],
        epilog="exit codes: 0 ok, 1 a patch or test failed, 2 usage, "
        "3 conflict needing a human, 4 integrity (hash/pin). "
        "Run 'xpu-series VERB --help' for a verb's options.",
    )
    parser.add_argument("--version", action="version", version=__version__)
    parser.add_argument(
        "-C", dest="project", metavar="DIR", help="project root (default: search up)"
    )
    # Accepted before the verb too ('xpu-series --json status').
    parser.add_argument(
        "--json", dest="json_first", action="store_true", help=argparse.SUPPRESS
    )
    sub = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb in VERBS:
        module = verb_module(verb)
        p = sub.add_parser(verb, help=module.HELP, description=module.__doc__)
        module.add_arguments(p)
        p.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def _emit_json(data: dict[str, Any]) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


def _print(output: Output, as_json: bool) -> None:
    if as_json:
        _emit_json(output.data if output.data is not None else {"ok": output.code == 0})
    elif output.out:
        print("\n".join(output.out))
    for line in output.err:
        print(line, file=sys.stderr)


def _failure(message: str, hint: str, code: int, as_json: bool) -> int:
    if as_json:
        _emit_json({"ok": False, "error": message, "hint": hint})
    print(f"error: {message}", file=sys.stderr)
    if hint:
        print(f"hint: {hint}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.json = bool(getattr(args, "json", False) or args.json_first)
    ctx = Context(args, say=lambda line: print(line, file=sys.stderr))
    try:
        output = verb_module(args.verb).execute(ctx)
    except XpuSeriesError as exc:
        return _failure(exc.message, exc.hint, int(exc.exit_code), args.json)
    except KeyboardInterrupt:
        return _failure(
            "interrupted", "run the same command again", ExitCode.FAILED, args.json
        )
    except OSError as exc:
        # A read-only or full disk, a vanished folder: say which file, no traceback.
        where = exc.filename or "a file"
        denied = exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
        return _failure(
            f"{where} is not writable ({exc.strerror})"
            if denied
            else f"cannot read or write {where}: {exc.strerror or exc}",
            "make that folder writable (or free space there), then run the "
            "same command again",
            ExitCode.FAILED,
            args.json,
        )
    _print(output, args.json)
    return int(output.code)


if __name__ == "__main__":
    sys.exit(main())
