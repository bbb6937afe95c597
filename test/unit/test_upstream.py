"""xpu-series upstream on a synthetic project: exports, bad input, revisions,
--compare-to, --forwarded and --check (pytest and upstream's hooks for real)."""

from __future__ import annotations

import ast
import os
import shutil
from pathlib import Path

import pytest
from conftest import BASE_FILES, Project, build_wheel, git, wheel_name, write_pin

from xpu_series.cli import main

ROOT = Path(__file__).resolve().parents[2]

# A stand-in for upstream's sglang/test/ci/ci_register.py: markers that do
# nothing, and a collector that reads module-level calls by AST.
CI_REGISTER = """\
import ast
from dataclasses import dataclass
from enum import Enum


class HWBackend(Enum):
    CPU = 1


@dataclass
class CIRegistry:
    backend: HWBackend
    filename: str
    est_time: float
    effective_suite: str
    nightly: bool = False
    disabled: str = None


def register_cpu_ci(est_time, suite=None, nightly=False, disabled=None):
    return None


def collect_tests(files, sanity_check=True):
    found = []
    for name in files:
        tree = ast.parse(open(name).read())
        calls = [
            n.value for n in tree.body
            if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
            and getattr(n.value.func, "id", "") == "register_cpu_ci"
        ]
        if not calls:
            raise ValueError(f"No CI registry found in {name}")
        if not any(isinstance(n, ast.If) for n in tree.body):
            raise ValueError(f"{name}: missing main entry")
        for call in calls:
            kw = {k.arg: k.value.value for k in call.keywords}
            found.append(CIRegistry(HWBackend.CPU, name, kw["est_time"], kw["suite"]))
    return found
"""

HELPERS = '''\
"""Helpers the project's tests share (not part of upstream)."""

ANSWER = 42


def expected() -> int:
    """What the fixed function returns."""
    return ANSWER
'''

TEST = '''\
"""answer() answers 42."""

import sys
import unittest
from pathlib import Path

from sglang.srt import other
from sglang.test.ci.ci_register import register_cpu_ci

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import expected  # noqa: E402

register_cpu_ci(est_time=1, suite="base-a-test-cpu")

# Only the slow class reads this.
SLOW_LIMIT = 3


class TestAnswer(unittest.TestCase):
    def test_answer(self):
        self.assertEqual(other.answer(), expected())


class TestSlowServer(unittest.TestCase):
    def test_limit(self):
        self.assertLess(other.answer(), SLOW_LIMIT * 100)


if __name__ == "__main__":
    unittest.main()
'''

TEST_PATH = "test/registered/unit/srt/test_answer.py"
FIXED = "def answer():\n    return 42\n"


@pytest.fixture
def hooks_cache() -> Path:
    """Upstream's hooks, installed once into this checkout's cache (pip)."""
    return ROOT / "build" / "cache" / "upstream-hooks"


@pytest.fixture
def up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], hooks_cache: Path
) -> Project:
    """A project whose wheel has a ci_register stand-in, and one patch whose
    test imports a project helper."""
    root = tmp_path / "proj"
    root.mkdir()
    files = dict(BASE_FILES)
    files["sglang/test/__init__.py"] = ""
    files["sglang/test/ci/__init__.py"] = ""
    files["sglang/test/ci/ci_register.py"] = CI_REGISTER
    wheel = tmp_path / wheel_name("0.0.1")
    sha = build_wheel(wheel, files)
    write_pin(root, "0.0.1", sha)
    (root / "patches" / "series").write_text("# test series\n")
    hooks_cache.mkdir(parents=True, exist_ok=True)
    (root / "build" / "cache").mkdir(parents=True)
    os.symlink(hooks_cache, root / "build" / "cache" / "upstream-hooks")

    def run(*args: str):
        from conftest import Result

        capsys.readouterr()
        code = main(["-C", str(root), *args])
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    proj = Project(root, wheel, sha, run)
    assert run("fetch", "--wheel", str(wheel)).code == 0
    assert run("apply").code == 0
    (root / "test/registered/unit/srt").mkdir(parents=True)
    (root / "test/registered/unit/helpers.py").write_text(HELPERS)
    (root / TEST_PATH).write_text(TEST)
    proj.add_patch(
        "python/sglang/srt/other.py",
        FIXED,
        "[XPU] Fix the answer",
        Tests=TEST_PATH,
        Fast_Tests=f"{TEST_PATH}::TestAnswer",
    )
    return proj


def _v(project: Project, n: int) -> Path:
    return project.root / "build/upstream/0001-fix-the-answer" / f"v{n}"


def _exported_test(project: Project, n: int) -> str:
    patch = next(_v(project, n).glob("0001-*.patch")).read_text()
    start = patch.index(f"+++ b/{TEST_PATH}")
    body = patch[start:].split("\ndiff --git", 1)[0].splitlines()[2:]
    return "\n".join(line[1:] for line in body if line.startswith("+")) + "\n"


def test_export_is_one_self_contained_commit(up: Project) -> None:
    result = up.run("upstream", "0001")
    assert result.code == 0, result.err
    folder = _v(up, 1)
    patch = next(folder.glob("0001-*.patch")).read_text()
    assert "Subject: [XPU] Fix the answer" in patch
    assert "+++ b/python/sglang/srt/other.py" in patch
    # Downstream bookkeeping stays home.
    assert "Concern:" not in patch and "Tests:" not in patch
    text = _exported_test(up, 1)
    tree = ast.parse(text)
    modules = {
        n.module if isinstance(n, ast.ImportFrom) else a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in n.names
    }
    assert "helpers" not in modules and "sys" not in modules
    assert "def expected()" in text and "ANSWER = 42" in text
    # The class outside Fast-Tests is left out, with what only it read.
    assert "TestSlowServer" not in text and "SLOW_LIMIT" not in text
    assert "left out TestSlowServer" in result.out
    # Formatted by upstream's hooks: sglang is first-party for isort.
    assert "import unittest\n\nfrom sglang.srt import other\n" in text
    pr = (folder / "pr.md").read_text()
    for heading in ("## Motivation", "## Modifications", "## Accuracy Tests",
                    "## Speed Tests and Profiling", "## Checklist"):  # fmt: skip
        assert heading in pr
    assert pr.startswith("# [XPU] Fix the answer\n")
    assert "no cached result" in pr  # verify never ran here: said so


def test_unchanged_export_keeps_its_revision_and_a_change_bumps_it(
    up: Project,
) -> None:
    assert up.run("upstream", "0001").code == 0
    again = up.run("upstream", "0001")
    assert "v1 (unchanged" in again.out
    assert not _v(up, 2).exists()
    test = up.root / TEST_PATH
    test.write_text(test.read_text().replace("answer() answers 42", "It is 42"))
    bumped = up.run("upstream", "0001", "--compare-to", "1")
    assert bumped.code == 0, bumped.err
    assert "v2 (new revision)" in bumped.out
    diff = up.root / "build/upstream/0001-fix-the-answer/range-diff-v1-v2.txt"
    text = diff.read_text()
    assert "It is 42" in text and "answer() answers 42" in text
    assert text.strip() in bumped.out


def test_compare_to_a_missing_revision_is_usage(up: Project) -> None:
    result = up.run("upstream", "0001", "--compare-to", "7")
    assert result.code == 2
    assert "no revision v7" in result.err and "v1" in result.err


def test_unknown_patch_lists_the_exportable_ones(up: Project) -> None:
    result = up.run("upstream", "0042")
    assert result.code == 2
    assert "no carried patch is called '0042'" in result.err
    assert "exportable: 0001-fix-the-answer" in result.err


def test_retired_patch_is_refused(up: Project) -> None:
    retired = up.patches / "upstreamed" / "0009-old-fix.patch"
    retired.parent.mkdir()
    retired.write_text((up.patches / "0001-fix-the-answer.patch").read_text())
    result = up.run("upstream", "9")
    assert result.code == 2
    assert "0009-old-fix.patch is retired" in result.err
    assert "exportable: 0001-fix-the-answer" in result.err


def test_a_patch_without_tests_is_refused(up: Project) -> None:
    up.add_patch("python/sglang/srt/third.py", "LIMIT = 20\n", "[XPU] Raise it")
    result = up.run("upstream", "0002")
    assert result.code == 1
    assert "0002-raise-it.patch names no tests" in result.err
    assert "hint:" in result.err


def test_missing_test_files_are_named(up: Project) -> None:
    up.add_patch(
        "python/sglang/srt/third.py", "LIMIT = 20\n", "[XPU] Raise it",
        Tests="test/registered/unit/srt/test_gone.py",
    )  # fmt: skip
    result = up.run("upstream", "0002")
    assert result.code == 1
    assert "test/registered/unit/srt/test_gone.py" in result.err


def test_a_dirty_tree_is_refused(up: Project) -> None:
    (up.tree / "python/sglang/srt/flags.py").write_text("VALUE = 3\n")
    result = up.run("upstream", "0001")
    assert result.code == 1
    assert "uncommitted edits" in result.err
    assert "hint: commit them" in result.err and "a test follows" in result.err


@pytest.mark.parametrize(
    "url", ["not-a-url", "ftp://x.org/pull/1", "https://github.com", "https:// x/1"]
)
def test_a_malformed_forwarded_url_is_usage(up: Project, url: str) -> None:
    before = (up.patches / "0001-fix-the-answer.patch").read_bytes()
    result = up.run("upstream", "0001", "--forwarded", url)
    assert result.code == 2
    assert "is not the address of a pull request" in result.err
    assert (up.patches / "0001-fix-the-answer.patch").read_bytes() == before


def test_forwarded_goes_through_the_tree_and_refresh(up: Project) -> None:
    up.add_patch(
        "python/sglang/srt/third.py", "LIMIT = 20\n", "[XPU] Raise it",
        Tests=TEST_PATH,
    )  # fmt: skip
    url = "https://github.com/sgl-project/sglang/pull/4242"
    result = up.run("upstream", "0001", "--forwarded", url)
    assert result.code == 0, result.err
    patch = (up.patches / "0001-fix-the-answer.patch").read_text()
    assert f"Forwarded: {url}\n" in patch
    message = git(up.tree, "log", "-1", "--format=%B", "HEAD^")
    assert f"Forwarded: {url}" in message
    # The patch above it is unchanged, and patches/ is what refresh writes.
    assert "Forwarded" not in (up.patches / "0002-raise-it.patch").read_text()
    assert up.run("refresh", "--check").code == 0
    status = up.run("status")
    assert url in status.out
    again = up.run("upstream", "0001", "--forwarded", url)
    assert "already Forwarded" in again.out


def test_check_proves_the_export(up: Project) -> None:
    result = up.run("upstream", "0001", "--check")
    assert result.code == 0, result.out + result.err
    for step in ("apply", "fail-without", "pass-with", "collector", "lint"):
        assert f"ok   {step}" in result.out
    assert "pristine upstream + tests: 0 passed, 1 failed" in result.out
    assert "pristine upstream + export: 1 passed, 0 failed" in result.out
    pr = (_v(up, 1) / "pr.md").read_text()
    assert "| upstream + the new tests only | 0 passed, 1 failed |" in pr
    assert "- [x] Formatted and linted" in pr


def test_pr_quotes_the_mutants_once_verify_has_run_them(
    up: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before any verify --mutants run there is nothing to quote, and no mutant
    # is made to look it up.
    from xpu_series.upstream import pr

    def made(*_args: object) -> None:
        raise AssertionError("mutants made with no outcome stored")

    with monkeypatch.context() as patched:
        patched.setattr(pr, "patch_mutants", made)
        assert up.run("upstream", "0001").code == 0
    pr = (_v(up, 1) / "pr.md").read_text()
    assert "`xpu-series verify --mutants 0001` has no cached result" in pr
    assert "Mutants of the added lines" not in pr
    mutants = up.run("verify", "--mutants", "--all")
    assert mutants.code == 0, mutants.out + mutants.err
    # The same export: the same revision, its pr.md written again.
    assert up.run("upstream", "0001").code == 0
    pr = (_v(up, 1) / "pr.md").read_text()
    assert "Mutants of the added lines (`xpu-series verify --mutants 0001`" in pr
    assert "has no cached result" not in pr.split("Mutants of the added")[1]


def test_tests_that_pass_on_pristine_fail_the_check(up: Project) -> None:
    test = up.root / TEST_PATH
    test.write_text(test.read_text().replace("expected())", "other.answer())"))
    result = up.run("upstream", "0001", "--check")
    assert result.code == 1
    assert "FAIL fail-without" in result.out
    assert "the tests prove nothing upstream" in result.out
    assert "fails upstream's checks: fail-without" in result.err


def test_pr_quotes_the_audit_findings_the_change_removes(up: Project) -> None:
    def result(uri: str, function: str, why: str) -> dict:
        where = {
            "physicalLocation": {
                "artifactLocation": {"uri": uri},
                "region": {"startLine": 2},
            },
            "logicalLocations": [{"fullyQualifiedName": function}],
        }
        return {
            "ruleId": "cuda-only-call",
            "message": {"text": f"torch.cuda.sync in {function}: fails on XPU."},
            "locations": [where],
            "suppressions": [{"kind": "external", "justification": why}],
        }

    import json

    reports = up.root / "build" / "reports"
    reports.mkdir(parents=True)
    sarif = {
        "runs": [
            {
                "results": [
                    result(
                        "python/sglang/srt/other.py",
                        "answer",
                        "the series changes this call",
                    ),
                    result(
                        "python/sglang/srt/other.py", "answer", "triaged: only on CUDA"
                    ),
                    result(
                        "python/sglang/srt/third.py",
                        "limit",
                        "the series changes this call",
                    ),
                ]  # fmt: skip
            }
        ]
    }
    (reports / "audit.sarif").write_text(json.dumps(sarif))
    assert up.run("upstream", "0001").code == 0
    pr = (_v(up, 1) / "pr.md").read_text()
    line = next(x for x in pr.splitlines() if x.startswith("The audit's findings"))
    assert "`cuda-only-call` at `python/sglang/srt/other.py:2`" in line
    assert "third.py" not in line and line.count("cuda-only-call") == 1


def test_a_tests_file_fast_tests_does_not_name_stays_home(up: Project) -> None:
    server = "test/registered/unit/srt/test_answer_server.py"
    (up.root / "test/standin").mkdir(parents=True)
    (up.root / "test/standin/cpu_standin.py").write_text("PORT = 1\n")
    (up.root / server).write_text(
        TEST.replace("from helpers import expected", "import cpu_standin")
    )
    up.add_patch(
        "python/sglang/srt/third.py", "LIMIT = 20\n", "[XPU] Raise it",
        Tests=f"{TEST_PATH} {server}", Fast_Tests=TEST_PATH,
    )  # fmt: skip
    result = up.run("upstream", "0002")
    assert result.code == 0, result.err
    assert f"left out {server} (starts real servers" in result.out
    patch = next((up.root / "build/upstream/0002-raise-it/v1").glob("*.patch"))
    assert server not in patch.read_text() and TEST_PATH in patch.read_text()
    pr = (up.root / "build/upstream/0002-raise-it/v1/pr.md").read_text()
    assert f"- not carried: `{server}`" in pr


def test_json_output_names_the_revision_and_its_files(up: Project) -> None:
    import json

    result = up.run("upstream", "0001", "--json")
    assert result.code == 0, result.err
    data = json.loads(result.out)
    assert data["revision"] == 1 and data["new"] is True
    assert data["tests"] == [TEST_PATH]
    assert data["functions"] == ["other.py: answer"]
    assert Path(data["pr"]).is_file() and Path(data["patch_file"]).is_file()


def test_a_helper_that_imports_a_helper_is_inlined_too(tmp_path: Path) -> None:
    from xpu_series.upstream.tests import export_test

    unit = tmp_path / "test/registered/unit"
    (unit / "srt").mkdir(parents=True)
    (unit / "helpers.py").write_text(HELPERS)
    (unit / "deep.py").write_text(
        "import sys\nfrom pathlib import Path\n\n"
        "sys.path.insert(0, str(Path(__file__).resolve().parent))\n"
        "from helpers import ANSWER, expected  # noqa: E402\n\n\n"
        "def same() -> bool:\n    return expected() == ANSWER\n"
    )
    (tmp_path / TEST_PATH).write_text(
        TEST.replace("from helpers import expected", "from deep import same")
        .replace("other.answer(), expected()", "same(), True")
    )  # fmt: skip
    exported = export_test(tmp_path, TEST_PATH)
    text = exported.text
    assert [m for m, _names in exported.inlined] == ["deep", "helpers"]
    assert "import deep" not in text and "from helpers" not in text
    assert "sys.path" not in text
    for definition in ("def same()", "def expected()", "ANSWER = 42"):
        assert text.count(definition) == 1
    ast.parse(text)
    # After the imports and the registration, before the tests that use them.
    at = text.index
    assert at("register_cpu_ci(est") < at("def expected()") < at("class TestAnswer")


LIMIT_TEST = '''\
"""LIMIT is large enough."""

import unittest

from sglang.srt import other, third
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=1, suite="base-a-test-cpu")


class TestLimit(unittest.TestCase):
    def test_limit(self):
        self.assertGreater(third.LIMIT, BOUND)

    def test_answer_is_upstreams(self):
        self.assertEqual(other.answer(), 41)


if __name__ == "__main__":
    unittest.main()
'''


def _second_patch(up: Project, bound: int) -> None:
    """0002 raises third.LIMIT to 20; its test asks for more than `bound`
    (10 or more fails on pristine upstream, as a proof must)."""
    path = "test/registered/unit/srt/test_limit.py"
    (up.root / path).write_text(LIMIT_TEST.replace("BOUND", str(bound)))
    up.add_patch(
        "python/sglang/srt/third.py", "LIMIT = 20\n", "[XPU] Raise the limit",
        Tests=path,
    )  # fmt: skip


def test_check_of_the_whole_series_proves_each_patch_in_one_run(
    up: Project,
) -> None:
    import json

    _second_patch(up, 10)
    result = up.run("upstream", "--all", "--check", "--json")
    assert result.code == 0, result.out + result.err
    data = json.loads(result.out)
    assert data["ok"] is True
    assert [p["check"]["ok"] for p in data["patches"]] == [True, True]
    # Each patch ran on its own tree in the shared interpreter: 0002's runs
    # see upstream's answer() (41), not the one 0001's run had just imported.
    first, second = (p["check"] for p in data["patches"])
    assert list(first["with"].values()) == ["passed"]
    assert sorted(second["without"].values()) == ["failed", "passed"]
    assert list(second["with"].values()) == ["passed", "passed"]


def test_one_failing_patch_of_several_fails_the_run_and_is_named(
    up: Project,
) -> None:
    _second_patch(up, 5)
    result = up.run("upstream", "0001", "0002", "--check")
    assert result.code == 1
    assert "ok: 0001-fix-the-answer v1 is ready for upstream" in result.out
    assert "FAIL fail-without" in result.out
    assert "0002-raise-the-limit v1 fails upstream's checks: fail-without" in (
        result.err
    )
    assert "0001-fix-the-answer" not in result.err


def test_a_test_that_kills_the_interpreter_is_reported(up: Project) -> None:
    test = up.root / TEST_PATH
    test.write_text(test.read_text().replace("\n\n# Only", "\nos._exit(3)\n\n# Only"))
    test.write_text("import os\n" + test.read_text())
    result = up.run("upstream", "0001", "--check")
    assert result.code == 1
    assert "the test server died" in result.out
    # The next check starts a server of its own and is not stuck on the dead one.
    test.write_text(TEST)
    assert up.run("upstream", "0001", "--check").code == 0


@pytest.mark.parametrize(
    ("args", "then"),
    [
        # The hint's command, followed literally, must work.
        ((), ("upstream", "--all")),
        (("--all", "0001"), ("upstream", "--all", "--check")),
        (("--all", "--compare-to", "1"), ("upstream", "0001", "--compare-to", "1")),
        (
            ("0001", "0002", "--forwarded", "https://github.com/sgl-project/sglang/pull/1"),
            ("upstream", "0001", "--forwarded",
             "https://github.com/sgl-project/sglang/pull/1"),
        ),
    ],
)  # fmt: skip
def test_patch_choice_mistakes_are_usage_and_the_hint_works(
    up: Project, args: tuple[str, ...], then: tuple[str, ...]
) -> None:
    import re

    result = up.run("upstream", *args)
    assert result.code == 2
    hint = result.err.split("hint: ", 1)[1]
    quoted = [q.split() for q in re.findall(r"'xpu-series ([^']+)'", hint)]
    # Placeholders (PATCH, N, URL) are the user's to fill: here with this case's.
    values = {"PATCH": "0001", "N": "1", "URL": then[-1]}
    filled = [[values.get(word, word) for word in words] for words in quoted]
    assert list(then) in filled, hint
    assert up.run("upstream", "0001").code == 0  # v1 exists to compare to
    assert up.run(*then).code == 0, up.run(*then).err


def test_the_check_record_stands_for_unchanged_exports_until_one_disagrees(
    up: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    _second_patch(up, 10)
    for name in ("CI", "XPU_SERIES_PROVE_ALL", "XPU_SERIES_PROOF_SAMPLE"):
        monkeypatch.delenv(name, raising=False)
    record = up.root / "patches" / "upstream-checks.json"
    args = ("upstream", "--all", "--check")
    written = up.run(*args, "--record")
    assert written.code == 0, written.out + written.err
    assert f"check record: wrote {record}" in written.out
    kept = json.loads(record.read_text())["checks"]
    assert sorted(kept) == ["0001-fix-the-answer.patch", "0002-raise-the-limit.patch"]

    # No sample: both checks come from the record; nothing runs, and the
    # output (and pr.md's tables, read off check.json) are the record's.
    monkeypatch.setenv("XPU_SERIES_PROOF_SAMPLE", "0")
    shutil.rmtree(up.root / "build" / "upstream")
    trusted = up.run(*args, "--json")
    assert trusted.code == 0, trusted.err
    assert "check record: 2 of 2 exports from patches/upstream-checks.json; " in (
        trusted.err
    )
    data = json.loads(trusted.out)
    assert [p["check"] for p in data["patches"]] == [
        kept[n]["result"] for n in sorted(kept)
    ]
    assert (_v(up, 1) / "pr.md").is_file()
    assert (
        json.loads((_v(up, 1) / "check.json").read_text())
        == (kept["0001-fix-the-answer.patch"]["result"])
    )

    # Everything re-checked: a record that tells a test's outcome wrong fails.
    bad = json.loads(record.read_text())
    check = bad["checks"]["0002-raise-the-limit.patch"]["result"]
    test = sorted(check["without"])[0]
    told = "passed" if check["without"][test] != "passed" else "failed"
    check["without"][test] = told
    record.write_text(json.dumps(bad))
    monkeypatch.setenv("XPU_SERIES_PROVE_ALL", "1")
    wrong = up.run(*args)
    assert wrong.code == 1
    said = "FAIL record: re-checked, it disagrees with patches/upstream-checks.json"
    assert f"{said}: without the export, {test} was " in wrong.out
    assert f"recorded {told}" in wrong.out
    monkeypatch.delenv("XPU_SERIES_PROVE_ALL")

    # A record of another version of the patch: it is checked in full, and
    # under CI the stale record fails the run until the command the hint names
    # writes it again.
    bad["checks"]["0002-raise-the-limit.patch"]["inputs"]["export"] = "0" * 64
    record.write_text(json.dumps(bad))
    monkeypatch.setenv("CI", "true")
    stale = up.run(*args)
    assert stale.code == 1
    assert "is stale for 1 export(s), checked in full here: " in stale.err
    assert "0002-raise-the-limit.patch (changed: export)" in stale.err
    (hint,) = [x for x in stale.err.splitlines() if x.startswith("hint: run '")]
    command = hint.split("'")[1].split()[1:]
    followed = up.run(*command)
    assert followed.code == 0, followed.out + followed.err
    assert up.run(*args).code == 0
