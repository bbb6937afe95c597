"""The registered tests' record (patches/registered.json): the registered step
runs every file whose inputs changed and every cheap one, re-checks a seeded
sample of the costly unchanged ones against the record, and fails in CI when the
record is stale; each input of a file's key invalidates it."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from xpu_series.registered import record

PLUGIN = ["-p", "no:cacheprovider", "-p", "xpu_series.registered.plugin"]
RECORD = "patches/registered.json"
LIGHT = "test/registered/unit/test_light.py"
HEAVY = "test/registered/unit/test_heavy.py"
HELPER = "test/registered/unit/heavy_helper.py"


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A checkout with two registered test files (one costly on record), a
    helper the costly one imports, and an sglang tree of its own in git."""
    root = tmp_path / "checkout"
    files = {
        "pyproject.toml": '[project]\nname = "x"\n[tool.pytest.ini_options]\n',
        "patches/upstream.toml": 'version = "0.5.23"\n',
        "test/registered/unit/conftest.py": "",
        LIGHT: (
            "import os\nfrom pathlib import Path\n\n"
            "def test_light():\n"
            "    if os.environ.get('MOVE'):\n"
            "        Path(os.environ['MOVE']).write_text('moved')\n"
            "    assert 1 + 1 == 2\n"
        ),
        HELPER: "VALUE = 3\n",
        HEAVY: (
            "import os, sys\nfrom pathlib import Path\n"
            "sys.path.insert(0, str(Path(__file__).parent))\n"
            "import pytest\nimport heavy_helper\n\n"
            "def test_heavy():\n"
            "    Path(os.environ['RAN']).write_text('heavy')\n"
            "    if os.environ.get('BREAK'):\n"
            "        pytest.skip('told to')\n"
            "    assert heavy_helper.VALUE == 3\n"
        ),
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    tree = tmp_path / "sglang-tree"
    (tree / "python" / "sglang").mkdir(parents=True)
    (tree / "python" / "sglang" / "__init__.py").write_text("VERSION = 1\n")
    _git(tree, "init", "-q")
    _git(tree, "add", "-A")
    _git(tree, "commit", "-q", "-m", "upstream")
    return root


def _env(root: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("XPU_SERIES_") and k not in ("CI", "PYTEST_ADDOPTS")
    }
    tree = root.parent / "sglang-tree" / "python"
    env.update(
        PYTHONPATH=os.pathsep.join([str(tree), *sys.path]),
        RAN=str(root.parent / "ran"),
        XPU_SERIES_PROOF_SEED="7",
        # Only the plugins named (-p): the installed ones cost each run 0.2 s.
        PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
    )
    env.update(extra)
    return env


def _pytest(root: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    (root.parent / "ran").unlink(missing_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *PLUGIN,
         f"--registered-record={RECORD}", *args, "test/registered/unit"],
        cwd=root, env=_env(root, **env), capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip


def _ran_heavy(root: Path) -> bool:
    return (root.parent / "ran").exists()


def _recorded(root: Path, seconds: float = 10.0) -> dict:
    """Write the record, then make the costly file costly on it."""
    done = _pytest(root, "--registered-write")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "recorded 2 files" in done.stdout
    data = json.loads((root / RECORD).read_text())
    data["files"][HEAVY]["seconds"] = seconds
    (root / RECORD).write_text(json.dumps(data))
    return data


def test_the_record_stands_for_a_costly_unchanged_file_and_cheap_ones_run(
    checkout: Path,
) -> None:
    data = _recorded(checkout)
    assert data["files"][LIGHT]["outcomes"] == {f"{LIGHT}::test_light": "passed"}
    assert data["files"][HEAVY]["outcomes"] == {f"{HEAVY}::test_heavy": "passed"}
    done = _pytest(checkout, CI="true", XPU_SERIES_REGISTERED_SAMPLE="0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert not _ran_heavy(checkout)  # not even collected
    assert "1 passed" in done.stdout
    assert "1 of 2 files run: 1 cheap; seed 7" in done.stdout
    assert "the record stands for 1\n" in done.stdout
    # The sample (one costly file by default) re-checks it, as does PROVE_ALL.
    for env in ({}, {"XPU_SERIES_PROVE_ALL": "1"}):
        again = _pytest(checkout, CI="true", **env)
        assert again.returncode == 0, again.stdout + again.stderr
        assert _ran_heavy(checkout) and "2 passed" in again.stdout


def test_a_re_check_that_disagrees_with_the_record_fails_the_run(
    checkout: Path,
) -> None:
    _recorded(checkout)
    # BREAK is no input of the key: the file is unchanged, its outcome is not.
    done = _pytest(checkout, BREAK="1")
    assert done.returncode == 1, done.stdout + done.stderr
    assert _ran_heavy(checkout)
    assert (
        f"{HEAVY}: the re-run disagrees with its record: "
        "test_heavy: passed on record, skipped now"
    ) in done.stdout


def test_a_stale_record_runs_in_full_fails_in_ci_and_the_hint_works(
    checkout: Path,
) -> None:
    _recorded(checkout)
    (checkout / HELPER).write_text("VALUE = 3  # same value, new bytes\n")
    local = _pytest(checkout, XPU_SERIES_REGISTERED_SAMPLE="0")
    assert local.returncode == 0, local.stdout + local.stderr
    assert _ran_heavy(checkout)
    assert f"2 of 2 files run: {HEAVY}, {LIGHT} (changed: tests)" in local.stdout
    ci = _pytest(checkout, CI="true", XPU_SERIES_REGISTERED_SAMPLE="0")
    assert ci.returncode == 1, ci.stdout + ci.stderr
    assert _ran_heavy(checkout) and "the record is stale for" in ci.stdout
    followed = _follow(checkout, ci.stdout.split("hint: ", 1)[1])
    assert followed.returncode == 0, followed.stdout + followed.stderr
    again = _pytest(checkout, CI="true", XPU_SERIES_REGISTERED_SAMPLE="0")
    assert again.returncode == 0, again.stdout + again.stderr
    # Recorded as it ran (seconds under CHEAP_S): cheap now, so it runs.
    assert "2 of 2 files run: 2 cheap;" in again.stdout


def test_a_partial_run_compares_what_it_ran_and_records_nothing(
    checkout: Path,
) -> None:
    _recorded(checkout)
    before = (checkout / RECORD).read_bytes()
    for args in (
        ["--collect-only"],
        ["-k", "light"],
        ["-k", "light", "--registered-write"],
    ):
        done = _pytest(checkout, *args, CI="true")
        assert done.returncode in (0, 5), done.stdout + done.stderr
        assert "disagrees" not in done.stdout, done.stdout
    assert "not recorded: not every test ran" in done.stdout
    assert (checkout / RECORD).read_bytes() == before
    # What it did run is still compared.
    done = _pytest(checkout, "-k", "heavy", BREAK="1")
    assert done.returncode == 1 and "passed on record, skipped now" in done.stdout


def test_a_tree_that_changes_while_the_tests_run_is_not_recorded(
    checkout: Path,
) -> None:
    moved = checkout.parent / "sglang-tree" / "python" / "sglang" / "new.py"
    done = _pytest(checkout, "--registered-write", MOVE=str(moved))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "not recorded: the tree changed while it ran" in done.stdout
    assert not (checkout / RECORD).exists()


def _follow(checkout: Path, hint: str) -> subprocess.CompletedProcess[str]:
    """The hint's command as printed, with this interpreter for .venv's."""
    args = shlex.split(hint.split("run '", 1)[1].split("'", 1)[0])
    assert args[0] == ".venv/bin/python"
    return subprocess.run(
        [sys.executable, *args[1:]], cwd=checkout, env=_env(checkout),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_a_damaged_record_is_an_error_whose_hint_writes_it_again(
    checkout: Path,
) -> None:
    (checkout / "patches" / "registered.json").write_text("{not json")
    done = _pytest(checkout, CI="true")
    assert done.returncode == 4, done.stdout + done.stderr  # usage error
    said = done.stdout + done.stderr
    assert "registered.json is not valid JSON" in said and "hint: run '" in said
    followed = _follow(checkout, said.split("hint: ", 1)[1])
    assert followed.returncode == 0, followed.stdout + followed.stderr
    assert "recorded 2 files" in followed.stdout
    again = _pytest(checkout, CI="true")
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_failing_run_writes_no_record(checkout: Path) -> None:
    (checkout / LIGHT).write_text("def test_light():\n    assert False\n")
    done = _pytest(checkout, "--registered-write")
    assert done.returncode == 1
    assert "not recorded: the run did not pass" in done.stdout
    assert not (checkout / RECORD).exists()


def _keyed(root: Path) -> None:
    """A record of both files as they are now, the costly one costly: the
    inputs as a run would key them (no test runs; their outcomes are not what
    these tests look at)."""
    inputs = _plan(root).inputs
    record.save(
        root / RECORD,
        {
            LIGHT: record.FileRecord(inputs[LIGHT], {}, 0.1),
            HEAVY: record.FileRecord(inputs[HEAVY], {}, 10.0),
        },
    )


def _plan(root: Path) -> record.Plan:
    tree = record.tree_state(root.parent / "sglang-tree" / "python" / "sglang")
    records = record.load(root / RECORD)
    return record.plan(root, [LIGHT, HEAVY], tree, records, seed=7)


def _edit(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.write_text(path.read_text() + text)


TREE = "../sglang-tree"


@pytest.mark.parametrize(
    ("change", "kind"),
    [
        (lambda r: _edit(r, HEAVY, "# edited\n"), "changed: tests"),
        (lambda r: _edit(r, HELPER, "# edited\n"), "changed: tests"),
        (lambda r: _edit(r, "test/registered/unit/conftest.py", "X = 1\n"),
         "changed: tests"),
        (lambda r: _edit(r, "pyproject.toml", 'version = "2"\n'),
         "changed: environment"),
        (lambda r: _edit(r, "patches/upstream.toml", "# other\n"), "changed: pin"),
        (lambda r: (_edit(r, f"{TREE}/python/sglang/__init__.py", "X = 2\n"),
                    _git(r.parent / "sglang-tree", "commit", "-qam", "patch")),
         "changed: tree"),
        (lambda r: _edit(r, f"{TREE}/python/sglang/__init__.py", "X = 2\n"),
         "changed: "),
        (lambda r: (r.parent / "sglang-tree" / "python" / "new.py").write_text(""),
         "changed: "),
    ],
    ids=["test-file", "helper", "conftest", "environment", "pin", "tree-commit",
         "tree-edited", "tree-untracked"],
)  # fmt: skip
def test_each_input_of_a_files_key_invalidates_its_record(
    checkout: Path, change, kind: str
) -> None:
    _keyed(checkout)
    before = _plan(checkout)
    assert before.run == {LIGHT: "cheap"} and HEAVY in before.sampled + before.trusted
    change(checkout)
    after = _plan(checkout)
    assert after.run.get(HEAVY, "").startswith(kind), after.run


@pytest.mark.parametrize("part", ["code", "tool", "python"])
def test_the_code_tool_and_python_version_are_inputs_too(
    checkout: Path, part: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _keyed(checkout)
    if part == "code":
        monkeypatch.setattr(record, "code_digest", lambda: "other code")
    elif part == "tool":
        monkeypatch.setattr(record.xpu_series, "__version__", "0.0.0-other")
    else:
        monkeypatch.setattr(sys, "version_info", (3, 99, 0))
        part = "environment"  # the proofs' environment names the version
    assert _plan(checkout).run[HEAVY] == f"changed: {part}"


def test_the_code_input_covers_the_package_and_the_proofs_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = Path(record.__file__).resolve().parents[1]
    copy = tmp_path / "xpu_series"
    for rel in ("registered/record.py", "registered/plugin.py", "proofs/record.py"):
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        (copy / rel).write_bytes((package / rel).read_bytes())
    monkeypatch.setattr(record, "_HERE", copy / "registered" / "record.py")
    seen = {record.code_digest()}
    for rel in ("registered/plugin.py", "proofs/record.py", "registered/record.py"):
        _edit(copy, rel, "# edited\n")
        seen.add(record.code_digest())
    assert len(seen) == 4
