"""Trace hook for `xpu-series audit`: records sglang's torch.cuda calls, per process.

Python imports `sitecustomize` at start-up from the first folder on sys.path that
has one, so putting this folder on PYTHONPATH loads the hook into a server and
into every process it spawns (multiprocessing's spawn children inherit the
environment). It does nothing unless XPU_SERIES_AUDIT_TRACE_DIR is set.

When it is set, an import hook waits for `torch.cuda` (and each of its
submodules) to finish importing, then replaces, in each of those namespaces:
- every function defined in torch.cuda by a wrapper that records its caller and
  calls the original (same result, same exception);
- the `__init__` (or, failing that, `__new__`) of every public class defined in
  torch.cuda, in place: the class object stays the same, so isinstance, `is` and
  subclassing behave as before.

A call is recorded when the frame that made it runs a file under
XPU_SERIES_AUDIT_TRACE_ROOT/python/sglang/. The record is that file (relative to
the root), the line Python reports for the call (the line where the call
expression starts), and the API as it was reached ("torch.cuda.empty_cache",
"torch.cuda.nvtx.range_push", "torch.cuda.Stream" for a construction). Records are
appended as JSON lines to <dir>/trace-<pid>.jsonl, each with a count to add up:
the first call of a site is written at once, and later ones at most every half
second per site (and at exit), so a process killed at shutdown keeps every site
it reached; only its last half second of repeat counts can be missing.

The hook imports only the standard library, never raises into the traced
program, and chains to any other sitecustomize further down sys.path.
Known side effects, none of which the stand-in's runs meet: a warning torch.cuda
raises with stacklevel=2 names this file instead of sglang's; and torch.compile,
where it would inline a torch.cuda function it has no rule for, inlines the
wrapper and stops at sys._getframe (a graph break; an error with fullgraph=True).
"""

from __future__ import annotations

import os
import sys

DIR_ENV = "XPU_SERIES_AUDIT_TRACE_DIR"
ROOT_ENV = "XPU_SERIES_AUDIT_TRACE_ROOT"
_PACKAGE = "torch.cuda"
_ORIGINAL = "__xpu_audit_original__"
_API = "__xpu_audit_api__"
_FLUSH_EVERY_S = 0.5


class _Recorder:
    """Counts calls per site and appends them to this process's JSONL file."""

    def __init__(self, out_dir: str, root: str) -> None:
        import _thread

        self.out_dir = out_dir
        self.root = root.rstrip("/") + "/"
        self.prefix = self.root + "python/sglang/"
        self.lock = _thread.RLock()
        self._reset()

    def _reset(self) -> None:
        self.pid = os.getpid()
        self.fd = -1
        # (file, line, api) -> [pending count, time of the last write]
        self.sites: dict[tuple[str, int, str], list[float]] = {}

    def after_fork(self) -> None:
        """A forked child writes its own file; its parent's counts are not its own."""
        import _thread

        self.lock = _thread.RLock()
        self._reset()

    def note(self, frame: object, api: str) -> None:
        code = frame.f_code  # type: ignore[attr-defined]
        filename = code.co_filename
        if not filename.startswith(self.prefix):
            return
        import time

        key = (filename[len(self.root) :], frame.f_lineno, api)  # type: ignore[attr-defined]
        now = time.monotonic()
        with self.lock:
            site = self.sites.get(key)
            if site is None:
                self.sites[key] = [0, now]
                self._write([(key, 1)])
                return
            site[0] += 1
            if now - site[1] >= _FLUSH_EVERY_S:
                self._flush(now)

    def _flush(self, now: float) -> None:
        due = []
        for key, site in self.sites.items():
            if site[0]:
                due.append((key, int(site[0])))
                site[0] = 0
                site[1] = now
        if due:
            self._write(due)

    def flush_all(self) -> None:
        import time

        with self.lock:
            if os.getpid() == self.pid:
                self._flush(time.monotonic())

    def _write(self, rows: list[tuple[tuple[str, int, str], int]]) -> None:
        import json

        if self.fd < 0:
            path = os.path.join(self.out_dir, f"trace-{self.pid}.jsonl")
            self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        text = "".join(
            json.dumps({"file": f, "line": line, "api": api, "count": count}) + "\n"
            for (f, line, api), count in rows
        )
        os.write(self.fd, text.encode())


_recorder: _Recorder | None = None
# Set once torch.cuda itself has finished importing (its namespace is complete).
_package_patched = False


def _traced(original, api: str):
    """A function that records its caller, then is `original`."""
    import functools

    @functools.wraps(original)
    def traced(*args, **kwargs):
        try:
            if _recorder is not None:
                _recorder.note(sys._getframe(1), api)
        except Exception:  # noqa: BLE001 - the hook must never break the program
            pass
        return original(*args, **kwargs)

    setattr(traced, _ORIGINAL, original)
    setattr(traced, _API, api)
    return traced


def _patch_functions(module: object, name: str) -> None:
    """Wrap the functions torch.cuda defines that `module`'s namespace holds."""
    import types

    for attr, value in list(vars(module).items()):
        if attr.startswith("__"):
            continue
        original = getattr(value, _ORIGINAL, value)
        if not isinstance(original, types.FunctionType):
            continue
        if not str(getattr(original, "__module__", "")).startswith(_PACKAGE):
            continue
        api = f"{name}.{attr}"
        if getattr(value, _API, None) == api:
            continue
        setattr(module, attr, _traced(original, api))


def _class_api(cls: type, module_name: str, attr: str) -> str:
    """A class's name as sglang writes it: torch.cuda.X where torch.cuda has it."""
    package = sys.modules.get(_PACKAGE)
    if package is not None and getattr(package, attr, None) is cls:
        return f"{_PACKAGE}.{attr}"
    return f"{module_name}.{attr}"


def _patch_class(cls: type, api: str) -> None:
    """Record constructions of `cls` by wrapping its own __init__ or __new__."""
    if _API in cls.__dict__ or issubclass(cls, BaseException):
        return
    if "__init__" in cls.__dict__:
        cls.__init__ = _traced(cls.__dict__["__init__"], api)
    elif "__new__" in cls.__dict__:
        raw = cls.__dict__["__new__"]
        original = raw.__func__ if isinstance(raw, staticmethod) else raw
        cls.__new__ = staticmethod(_traced(original, api))
    else:
        return  # nothing of its own to wrap (the legacy storage classes)
    setattr(cls, _API, api)


def _patch_classes(module: object, name: str) -> None:
    for attr, value in list(vars(module).items()):
        if attr.startswith("_") or not isinstance(value, type):
            continue
        if str(getattr(value, "__module__", "")).startswith(_PACKAGE):
            _patch_class(value, _class_api(value, name, attr))


def patch_loaded() -> None:
    """Patch torch.cuda and every submodule already imported (idempotent)."""
    global _package_patched
    loaded = [
        (name, module)
        for name, module in list(sys.modules.items())
        if module is not None and (name == _PACKAGE or name.startswith(_PACKAGE + "."))
    ]
    # The package last: its namespace re-exports the submodules' functions.
    loaded.sort(key=lambda item: item[0] == _PACKAGE)
    for name, module in loaded:
        _patch_functions(module, name)
    # Classes once the package is complete, so they are named as torch.cuda.X.
    if _PACKAGE in sys.modules:
        for name, module in loaded:
            _patch_classes(module, name)
        _package_patched = True


class _PatchingLoader:
    """Runs the real loader, then patches what the module defined."""

    def __init__(self, loader: object, name: str) -> None:
        self._loader = loader
        self._name = name

    def __getattr__(self, attr: str):
        return getattr(self._loader, attr)

    def create_module(self, spec):
        return self._loader.create_module(spec)  # type: ignore[attr-defined]

    def exec_module(self, module) -> None:
        try:
            self._loader.exec_module(module)  # type: ignore[attr-defined]
        finally:
            try:
                module.__loader__ = self._loader
                if getattr(module, "__spec__", None) is not None:
                    module.__spec__.loader = self._loader
            except Exception:  # noqa: BLE001
                pass
        try:
            if self._name == _PACKAGE:
                patch_loaded()
            else:
                _patch_functions(module, self._name)
                if _package_patched:
                    # A submodule imported after the package (lazily).
                    _patch_classes(module, self._name)
        except Exception:  # noqa: BLE001
            pass


class _TorchCudaFinder:
    """A meta path finder that only wraps the loader of torch.cuda's modules."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _PACKAGE and not fullname.startswith(_PACKAGE + "."):
            return None
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _PatchingLoader(spec.loader, fullname)
            return spec
        except Exception:  # noqa: BLE001 - let the normal import machinery try
            return None


def install(out_dir: str, root: str) -> None:
    """Start recording into `out_dir` the torch.cuda calls made under `root`."""
    global _recorder
    import atexit

    if _recorder is not None:
        return
    _recorder = _Recorder(out_dir, root)
    os.register_at_fork(after_in_child=_recorder.after_fork)
    atexit.register(_recorder.flush_all)
    sys.meta_path.insert(0, _TorchCudaFinder())
    patch_loaded()


def _chain() -> None:
    """Run the sitecustomize this file shadows, as site.py would have."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def _start() -> None:
    out_dir = os.environ.get(DIR_ENV)
    root = os.environ.get(ROOT_ENV)
    if out_dir and root:
        try:
            install(out_dir, root)
        except Exception:  # noqa: BLE001 - tracing is best effort
            pass
    if __name__ == "sitecustomize":
        try:
            _chain()
        except Exception:  # noqa: BLE001 - site.py also goes on after one fails
            pass


_start()
