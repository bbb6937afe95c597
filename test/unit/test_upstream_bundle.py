"""xpu-series upstream on a synthetic project: related upstream work and upstream's
own tests in pr.md (patches/upstream-work.toml), its motivation, and bundles of
patches exported and checked as one pull request (patches/bundles.toml)."""

# The `up` fixture comes from test_upstream (imported so pytest finds it); its
# name as each test's argument is what pytest injects, not a redefinition.
# ruff: noqa: F811

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import Project, git
from test_upstream import TEST_PATH, hooks_cache, up  # noqa: F401

ANSWER = "0001-fix-the-answer"
LIMIT_PATH = "test/registered/unit/srt/test_limit_only.py"
LIMIT_TEST = '''\
"""LIMIT is large enough."""

import unittest

from sglang.srt import third
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=1, suite="base-a-test-cpu")


class TestLimit(unittest.TestCase):
    def test_limit(self):
        self.assertGreater(third.LIMIT, BOUND)


if __name__ == "__main__":
    unittest.main()
'''
LIMIT_MESSAGE = """\
[XPU] Raise the limit

On XPU every request over the limit is refused: LIMIT is 10.

LIMIT is now 20 on every device.

Not changed: how the limit is read.

Upstream-Status: Pending
Concern: limit
Origin: other, found by a static audit of 0.0.1 (LIMIT in third.py)
Tests: {path}
"""
BUNDLE = """\
[[bundle]]
name = "answer-and-limit"
title = "[Intel GPU] Answer and limit on XPU"
patches = [{patches}]
motivation = \"\"\"
The answer and the limit are both wrong on XPU; reviewed together.
\"\"\"
"""
WORK = """\
[[related]]
patch = "{patch}"
url = "https://github.com/sgl-project/sglang/pull/4242"
state = "{state}"
seen = 2026-11-30
differs = "Fixes the answer on every device; ours only on XPU."

[[upstream-test]]
patch = "{patch}"
path = "test/registered/unit/srt/test_upstream_answer.py"
seen = 2026-11-30
commit = "{commit}"
breaks = "Asserts the answer is 41."

[searched]
"{patch}" = 2026-11-30
"""


def _limit_patch(up: Project, bound: int) -> None:
    """0002 raises third.LIMIT to 20, with a description of three paragraphs
    and an Origin; its test asks for more than `bound` (10 or more fails on
    pristine upstream)."""
    (up.root / LIMIT_PATH).write_text(LIMIT_TEST.replace("BOUND", str(bound)))
    (up.tree / "python/sglang/srt/third.py").write_text("LIMIT = 20\n")
    git(up.tree, "add", "-A")
    git(up.tree, "commit", "-q", "-m", LIMIT_MESSAGE.format(path=LIMIT_PATH))
    assert up.run("refresh").code == 0


def _declare(up: Project, *patches: str) -> None:
    names = ", ".join(f'"{p}"' for p in patches)
    (up.patches / "bundles.toml").write_text(BUNDLE.format(patches=names))


def _work(up: Project, patch: str = ANSWER, state: str = "open") -> Path:
    path = up.patches / "upstream-work.toml"
    path.write_text(WORK.format(patch=patch, state=state, commit="a" * 40))
    return path


def _sections(pr: str) -> dict[str, str]:
    """pr.md's `## ` sections by heading, in order."""
    parts = re.split(r"^## (.+)$", pr, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def _pr(up: Project, name: str, revision: int = 1) -> str:
    return (up.root / "build/upstream" / name / f"v{revision}" / "pr.md").read_text()


# -- patches/upstream-work.toml ------------------------------------------------


def test_pr_names_related_work_and_the_upstream_tests_to_update(up: Project) -> None:
    _work(up)
    result = up.run("upstream", "0001")
    assert result.code == 0, result.err
    sections = _sections(_pr(up, ANSWER))
    assert list(sections)[:4] == [
        "Motivation",
        "Related upstream work",
        "Modifications",
        "Upstream tests this changes",
    ]
    related = sections["Related upstream work"]
    assert (
        "- [#4242](https://github.com/sgl-project/sglang/pull/4242) (open, as of "
        "2026-11-30): Fixes the answer on every device; ours only on XPU." in related
    )
    tests = sections["Upstream tests this changes"]
    assert "must be updated" in tests
    assert (
        "- `test/registered/unit/srt/test_upstream_answer.py` (read at "
        "`aaaaaaaaaaaa`, 2026-11-30): Asserts the answer is 41." in tests
    )
    assert "- [ ] Upstream's own tests named above updated" in sections["Checklist"]


def test_a_searched_patch_without_entries_says_none_was_found(up: Project) -> None:
    (up.patches / "upstream-work.toml").write_text(
        f'[searched]\n"{ANSWER}" = 2026-11-29\n'
    )
    assert up.run("upstream", "0001").code == 0
    sections = _sections(_pr(up, ANSWER))
    assert "none found (searched 2026-11-29)" in sections["Related upstream work"]
    assert "None found: no upstream test" in sections["Upstream tests this changes"]
    assert "Upstream's own tests named above" not in sections["Checklist"]


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (
            lambda t: t.replace('state = "open"', 'state = "closed"'),
            "state 'closed' is not one of open, closed-unmerged, merged",
        ),
        (
            lambda t: t.replace(ANSWER, "0042-nothing", 1),
            "'0042-nothing' is not a patch of the series",
        ),
        (
            lambda t: t.replace("pull/4242", "wiki/4242"),
            "is not a GitHub pull request or issue",
        ),
        (
            lambda t: t.replace("seen = 2026-11-30", 'seen = "last week"', 1),
            "seen 'last week' is not a date",
        ),
        (
            lambda t: t.replace('differs = "Fixes', 'differs = """\nFixes')
            .replace('XPU."', 'XPU.\nSecond line."""'),
            "differs is not one line",
        ),
        (
            lambda t: t.replace('breaks = "', 'verdict = "'),
            "unknown key 'verdict'",
        ),
    ],
)  # fmt: skip
def test_a_malformed_entry_is_refused_naming_it(
    up: Project, edit: object, said: str
) -> None:
    path = _work(up)
    path.write_text(edit(path.read_text()))  # type: ignore[operator]
    result = up.run("upstream", "0001")
    assert result.code == 2
    assert "patches/upstream-work.toml: [[" in result.err and said in result.err
    assert "hint:" in result.err
    assert not (up.root / "build/upstream" / ANSWER).exists()


def test_an_unknown_patch_lists_the_names_to_use(up: Project) -> None:
    _work(up, patch="0042-nothing")
    result = up.run("upstream", "0001")
    assert result.code == 2
    assert "'0042-nothing' is not a patch of the series" in result.err
    assert "hint: name a patch by its stem, as in patches/series" in result.err
    assert ANSWER in result.err.split("hint:", 1)[1]


def test_a_retired_patch_s_entries_are_kept_out(up: Project) -> None:
    retired = up.patches / "upstreamed" / "0009-old-fix.patch"
    retired.parent.mkdir()
    retired.write_text((up.patches / f"{ANSWER}.patch").read_text())
    _work(up, patch="0009-old-fix")
    assert up.run("upstream", "0001").code == 0
    assert "#4242" not in _pr(up, ANSWER)


# -- motivation --------------------------------------------------------------


def test_motivation_is_the_failure_and_the_fix_and_origin_a_footnote(
    up: Project,
) -> None:
    _limit_patch(up, 10)
    assert up.run("upstream", "0002").code == 0
    pr = _pr(up, "0002-raise-the-limit")
    motivation = _sections(pr)["Motivation"].strip().split("\n\n")
    assert motivation == [
        "On XPU every request over the limit is refused: LIMIT is 10.[^1]",
        "LIMIT is now 20 on every device.",
    ]
    assert "Not changed: how the limit is read." in _sections(pr)["Modifications"]
    # How it was found: only in the footnote, after everything upstream reads.
    assert pr.count("static audit") == 1
    assert pr.rstrip().endswith(
        "[^1]: Origin: found by a static audit of 0.0.1 (LIMIT in third.py)."
    )


# -- bundles -----------------------------------------------------------------


def test_a_bundle_is_one_pull_request_with_every_patch_and_its_tests(
    up: Project,
) -> None:
    _limit_patch(up, 10)
    _declare(up, ANSWER, "0002-raise-the-limit")
    result = up.run("upstream", "--bundle", "answer-and-limit", "--json")
    assert result.code == 0, result.err
    data = json.loads(result.out)
    assert data["bundle"] == "answer-and-limit"
    assert data["patches"] == [f"{ANSWER}.patch", "0002-raise-the-limit.patch"]
    assert data["tests"] == [TEST_PATH, LIMIT_PATH]
    folder = up.root / "build/upstream/answer-and-limit/v1"
    files = sorted(p.name for p in folder.glob("*.patch"))
    assert files == ["0001-XPU-Fix-the-answer.patch", "0002-XPU-Raise-the-limit.patch"]
    second = (folder / files[1]).read_text()
    assert "+LIMIT = 20" in second and f"+++ b/{LIMIT_PATH}" in second
    assert TEST_PATH not in second  # each patch's tests ride in its own commit
    # One branch holds both commits, on pristine upstream.
    work = up.root / "build/upstream/.work"
    log = git(work, "log", "--format=%s", "-2", "pr/answer-and-limit")
    assert log.splitlines() == ["[XPU] Raise the limit", "[XPU] Fix the answer"]
    pr = (folder / "pr.md").read_text()
    assert pr.startswith("# [Intel GPU] Answer and limit on XPU\n")
    sections = _sections(pr)
    motivation = sections["Motivation"]
    assert motivation.index("both wrong on XPU") < motivation.index("Raise the limit")
    assert "### Fix the answer" in sections["Modifications"]
    assert "### Raise the limit" in sections["Modifications"]
    assert "--bundle answer-and-limit --check" in sections["Accuracy Tests"]
    # Unchanged on the next export: the same revision.
    again = up.run("upstream", "--bundle", "answer-and-limit")
    assert "answer-and-limit: v1 (unchanged" in again.out


def test_a_changed_bundle_is_a_new_revision_compared_across_commits(
    up: Project,
) -> None:
    _limit_patch(up, 10)
    _declare(up, ANSWER, "0002-raise-the-limit")
    assert up.run("upstream", "--bundle", "answer-and-limit").code == 0
    test = up.root / LIMIT_PATH
    test.write_text(test.read_text().replace("is large enough", "is at least 11"))
    result = up.run("upstream", "--bundle", "answer-and-limit", "--compare-to", "1")
    assert result.code == 0, result.err
    assert "answer-and-limit: v2 (new revision)" in result.out
    text = (
        up.root / "build/upstream/answer-and-limit/range-diff-v1-v2.txt"
    ).read_text()
    # Both commits are paired; only the second changed.
    first, second = text.splitlines()[:2]
    assert " = " in first and first.endswith("[XPU] Fix the answer")
    assert " ! " in second and second.endswith("[XPU] Raise the limit")
    assert "is at least 11" in text and "is large enough" in text


def test_check_proves_each_patch_of_a_bundle(up: Project) -> None:
    _limit_patch(up, 10)
    _declare(up, ANSWER, "0002-raise-the-limit")
    result = up.run("upstream", "--bundle", "answer-and-limit", "--check")
    assert result.code == 0, result.out + result.err
    for step in ("apply", "fail-without", "pass-with", "collector", "lint"):
        assert f"ok   {step}" in result.out
    assert (
        "pristine upstream + tests: 0 passed, 2 failed "
        "(0001: 0 passed, 1 failed; 0002: 0 passed, 1 failed)" in result.out
    )
    assert "ok: answer-and-limit v1 is ready for upstream" in result.out
    pr = _pr(up, "answer-and-limit")
    assert "- [x] Unit tests added" in pr and "- [x] Formatted and linted" in pr


def test_a_bundle_patch_whose_tests_prove_nothing_fails_the_check(
    up: Project,
) -> None:
    _limit_patch(up, 5)  # LIMIT > 5 holds on pristine upstream already
    _declare(up, ANSWER, "0002-raise-the-limit")
    result = up.run("upstream", "--bundle", "answer-and-limit", "--check")
    assert result.code == 1
    assert "FAIL fail-without" in result.out
    assert "the tests of 0002-raise-the-limit prove nothing upstream" in result.out
    assert "'xpu-series upstream --bundle answer-and-limit --check'" in result.err


def test_all_exports_every_declared_bundle_after_the_patches(up: Project) -> None:
    _limit_patch(up, 10)
    _declare(up, ANSWER, "0002-raise-the-limit")
    result = up.run("upstream", "--all", "--json")
    assert result.code == 0, result.err
    data = json.loads(result.out)
    assert [p["patch"] for p in data["patches"]] == [
        f"{ANSWER}.patch",
        "0002-raise-the-limit.patch",
    ]
    assert [b["bundle"] for b in data["bundles"]] == ["answer-and-limit"]


def test_named_patches_make_a_bundle_of_their_own(up: Project) -> None:
    _limit_patch(up, 10)
    result = up.run("upstream", "--bundle", "ad-hoc", "0002", "0001")
    assert result.code == 0, result.err
    assert "not as patches/bundles.toml declares it" in result.out
    pr = _pr(up, "ad-hoc")
    # Series order, whatever order they were named in.
    assert pr.startswith("# [XPU] Fix the answer; Raise the limit\n")


@pytest.mark.parametrize(
    ("args", "bundles", "said"),
    [
        (("--bundle", "x-y", "0001", "0042"), None,
         "no carried patch is called '0042'"),
        (("--bundle", "answer-and-limit"), '"0001-fix-the-answer", "0042-gone"',
         "patches/bundles.toml: bundle 'answer-and-limit': no carried patch is "
         "called '0042-gone'"),
        (("--bundle", "nowhere"), None, "no bundle called 'nowhere'"),
        (("--bundle", "x-y", "0001"), None, "a bundle takes two or more"),
        (("--bundle", "Bad_Name", "0001", "0002"), None, "bundle name 'Bad_Name'"),
        (("--bundle", "x-y", "--all"), None, "give --bundle NAME or --all"),
    ],
)  # fmt: skip
def test_bundle_mistakes_are_usage_errors(
    up: Project, args: tuple[str, ...], bundles: str | None, said: str
) -> None:
    if bundles is not None:
        (up.patches / "bundles.toml").write_text(BUNDLE.format(patches=bundles))
    result = up.run("upstream", *args)
    assert result.code == 2
    assert said in result.err and "hint:" in result.err
    assert not (up.root / "build/upstream/x-y").exists()


def test_forwarded_with_a_bundle_goes_into_each_patch(up: Project) -> None:
    _limit_patch(up, 10)
    _declare(up, ANSWER, "0002-raise-the-limit")
    url = "https://github.com/sgl-project/sglang/pull/4343"
    result = up.run("upstream", "--bundle", "answer-and-limit", "--forwarded", url)
    assert result.code == 0, result.err
    for name in (ANSWER, "0002-raise-the-limit"):
        assert f"Forwarded: {url}\n" in (up.patches / f"{name}.patch").read_text()
    assert up.run("refresh", "--check").code == 0
