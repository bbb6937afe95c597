"""The shape of the tool: every module imports, no verb imports another verb, and no
module grows past the size a reader can hold without saying why."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import xpu_series

PACKAGE = Path(xpu_series.__file__).resolve().parent
LIMIT = 600
# A module may pass LIMIT only if its docstring says why, in a line starting so.
REASON = "Longer than 600 lines because"


def _modules(package_dir: Path) -> list[Path]:
    return sorted(p for p in package_dir.rglob("*.py") if "tracer" not in p.parts)


def verb_imports(commands_dir: Path) -> list[str]:
    """Each `commands/<verb>.py` that imports another module of `commands/`."""
    verbs = {p.stem for p in commands_dir.glob("*.py") if p.stem != "__init__"}
    bad = []
    for path in sorted(commands_dir.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module.startswith("xpu_series.commands."):
                    names.append(node.module.rsplit(".", 1)[1])
                elif node.module == "xpu_series.commands":
                    names += [a.name for a in node.names if a.name in verbs]
                elif node.level == 1 and node.module:  # from .verb import x
                    names.append(node.module.split(".")[0])
                elif node.level == 1:
                    names += [a.name for a in node.names if a.name in verbs]
            elif isinstance(node, ast.Import):
                names += [
                    a.name.split(".")[2]
                    for a in node.names
                    if a.name.startswith("xpu_series.commands.")
                ]
            for name in names:
                if name in verbs and name != path.stem:
                    bad.append(f"{path.name} imports commands.{name}")
    return bad


def oversized(package_dir: Path) -> list[str]:
    """Modules past LIMIT lines whose docstring gives no reason."""
    bad = []
    for path in _modules(package_dir):
        text = path.read_text(encoding="utf-8")
        lines = text.count("\n")
        if lines <= LIMIT:
            continue
        doc = ast.get_docstring(ast.parse(text)) or ""
        if not any(line.startswith(REASON) for line in doc.splitlines()):
            bad.append(f"{path.relative_to(package_dir)}: {lines} lines")
    return bad


def test_every_module_imports() -> None:
    names = [
        m.name
        for m in pkgutil.walk_packages([str(PACKAGE)], "xpu_series.")
        if not m.name.endswith("__main__") and ".tracer" not in m.name
    ]
    assert len(names) > 40
    for name in names:
        importlib.import_module(name)


def test_no_verb_imports_another_verb() -> None:
    assert verb_imports(PACKAGE / "commands") == []


def test_no_module_past_the_limit_without_a_reason() -> None:
    assert oversized(PACKAGE) == []


def test_every_package_says_what_it_is_for() -> None:
    for init in PACKAGE.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert doc, f"{init.relative_to(PACKAGE)} has no docstring"


@pytest.mark.parametrize(
    "line",
    [
        "from xpu_series.commands.apply import run\n",
        "from xpu_series.commands import apply\n",
        "import xpu_series.commands.apply\n",
        "from .apply import run\n",
    ],
)
def test_the_verb_check_catches_each_form(tmp_path: Path, line: str) -> None:
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "apply.py").write_text("")
    (tmp_path / "check.py").write_text(line)
    assert verb_imports(tmp_path) == ["check.py imports commands.apply"]


def test_the_size_check_catches_a_long_module_and_hears_a_reason(
    tmp_path: Path,
) -> None:
    body = "x = 1\n" * (LIMIT + 1)
    (tmp_path / "long.py").write_text('"""A long one."""\n' + body)
    assert oversized(tmp_path) == [f"long.py: {LIMIT + 2} lines"]
    (tmp_path / "long.py").write_text(
        f'"""A long one.\n\n{REASON} it is one table.\n"""\n' + body
    )
    assert oversized(tmp_path) == []
