"""Every failure leaves a state the tool itself repairs, and every hint it prints
works when followed literally (issue: interrupts, bad wheels, read-only disks,
silent renames, reports that agree with their exit codes)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import BASE_FILES, Project, build_wheel, git, interrupt, wheel_name

from xpu_series.stack.operation import snapshot

PYTHON = Path(__file__).parents[2] / "python"


def hint_of(stderr: str) -> str:
    """The command a `hint:` line names first ('xpu-series ...')."""
    line = next(line for line in stderr.splitlines() if line.startswith("hint:"))
    return line.split("'")[1]


@pytest.mark.parametrize(
    ("where", "fresh"),
    [
        *((w, fresh) for w in ("fetch", "base", "patch1", "patch3")
          for fresh in (True, False)),
        ("checkout", True),  # only a new tree is cloned and checked out
    ],
)  # fmt: skip
def test_interrupted_apply_is_repaired_by_its_hint(
    three_patches: Project, where: str, fresh: bool
) -> None:
    """Item 1: Ctrl-C while apply builds the tree; the hint, followed, ends well."""
    if fresh:
        shutil.rmtree(three_patches.tree)
    proc = interrupt(three_patches, where, "apply")
    assert proc.returncode != 0
    if where == "checkout" and fresh:
        # Built beside and never renamed in: no half tree at the final path.
        assert not three_patches.tree.exists()
    else:
        assert "hint:" in proc.stderr, proc.stderr
        command = hint_of(proc.stderr)
        assert command == "xpu-series apply --continue"
    # status explains instead of printing a raw git error.
    status = three_patches.run("status")
    assert status.code == 0 and "usage" not in status.err
    # A plain apply (no --force) rebuilds what the interrupt left.
    result = three_patches.run("apply")
    assert result.code == 0, result.err
    assert git(three_patches.tree, "status", "--porcelain") == ""
    assert (
        len(git(three_patches.tree, "log", "--format=%s", "upstream..").split("\n"))
        == 3
    )
    leftovers = list(three_patches.tree.parent.glob(".sglang.partial-*"))
    assert leftovers == []


def test_interrupted_apply_continue_hint_finishes(three_patches: Project) -> None:
    proc = interrupt(three_patches, "patch2", "apply")
    assert proc.returncode != 0
    result = three_patches.run(*hint_of(proc.stderr).split()[1:])
    assert result.code == 0, result.err
    assert git(three_patches.tree, "status", "--porcelain") == ""


def test_junk_wheel_never_replaces_a_good_cached_one(
    three_patches: Project, tmp_path: Path
) -> None:
    """Item 2: a bad --wheel next to a good cached release."""
    good = tmp_path / "good" / wheel_name("0.0.2")
    good.parent.mkdir()
    build_wheel(good, BASE_FILES, version="0.0.2")
    first = three_patches.run("fetch", "--upstream", "0.0.2", "--wheel", str(good))
    assert first.code == 0
    fetched = three_patches.run("fetch", "--upstream", "0.0.2", "--json")
    cached = Path(json.loads(fetched.out)["path"])
    kept = cached.read_bytes()
    junk = tmp_path / "junk" / wheel_name("0.0.2")
    junk.parent.mkdir()
    junk.write_bytes(b"junk!\n")
    result = three_patches.run("check", "--upstream", "0.0.2", "--wheel", str(junk))
    assert result.code == 4 and "not a readable wheel" in result.err
    assert cached.read_bytes() == kept
    # Offline, the cached release is still what fetch and check use.
    again = three_patches.run("check", "--upstream", "0.0.2", "--json")
    assert again.code == 0, again.err
    assert json.loads(again.out)["upstream"]["sha256"] == cached.parent.name


def _unshare_works() -> bool:
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True, check=False)
    return probe.returncode == 0


@pytest.mark.skipif(
    shutil.which("unshare") is None or not _unshare_works(),
    reason="needs unshare (util-linux) with user namespaces for a read-only mount",
)
@pytest.mark.parametrize("verb", ["check", "apply", "matrix", "refresh"])
def test_read_only_build_is_a_clear_error(three_patches: Project, verb: str) -> None:
    """Item 3: a read-only build/ gives one error line and a hint, no traceback."""
    build = three_patches.root / "build"
    script = (
        f"mount --bind -o ro {build} {build} && "
        f"PYTHONPATH={PYTHON} {sys.executable} -m xpu_series "
        f"-C {three_patches.root} {verb}"
    )
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "is not writable" in errors[0]
    assert "hint:" in proc.stderr


def _point_0003_at(project: Project, path: str) -> None:
    patch = project.patches / "0003-raise-the-limit.patch"
    patch.write_text(patch.read_text().replace("python/sglang/srt/third.py", path))


def test_patch_naming_a_missing_file_is_not_merged_on_the_pin(
    three_patches: Project,
) -> None:
    """Item 4: git's 3-way fallback must not move a patch to another file."""
    _point_0003_at(three_patches, "python/sglang/srt/no_such_file.py")
    result = three_patches.run("check", "--json")
    assert result.code == 1
    third = json.loads(result.out)["patches"][2]
    assert third["status"] == "conflict"
    assert (
        "python/sglang/srt/no_such_file.py -> python/sglang/srt/third.py"
        in (third["detail"])
    )


def test_check_reports_tests_that_do_not_exist(three_patches: Project) -> None:
    """Item 5."""
    patch = three_patches.patches / "0002-fix-the-answer.patch"
    patch.write_text(
        patch.read_text().replace(
            "Concern: fix-the-answer\n",
            "Concern: fix-the-answer\nTests: test/nope.py\n",
        )
    )
    result = three_patches.run("check")
    assert result.code == 1
    assert "0002-fix-the-answer.patch: Tests: test/nope.py does not exist" in result.err


def test_reports_and_exit_codes_agree(three_patches: Project, tmp_path: Path) -> None:
    """Item 6."""
    p2 = three_patches.patches / "0002-fix-the-answer.patch"
    p2.write_text(p2.read_text().replace("-    return 41", "-    return 40"))
    matrix = three_patches.run("matrix", "0.0.1", "--json")
    assert json.loads(matrix.out)["ok"] is False and matrix.code == 1
    status = json.loads(three_patches.run("status", "--json").out)
    assert status["upstream"]["pinned"] is True
    assert three_patches.run("--json", "status").code == 0
    check = three_patches.run("check")
    hints = [line for line in check.err.splitlines() if line.startswith("hint:")]
    assert all("run 'xpu-series check' to" not in line for line in hints)


def test_local_wheel_mismatch_blames_the_file_not_the_index(
    three_patches: Project, tmp_path: Path
) -> None:
    other = tmp_path / "o" / wheel_name("0.0.1")
    other.parent.mkdir()
    build_wheel(other, {"sglang/__init__.py": "# other\n"})
    result = three_patches.run("fetch", "--wheel", str(other))
    assert result.code == 4
    assert "the file you passed" in result.err and "index" not in result.err


def test_renamed_non_sglang_wheel_says_so(
    three_patches: Project, tmp_path: Path
) -> None:
    wheel = tmp_path / "w" / wheel_name("0.0.2")
    wheel.parent.mkdir()
    build_wheel(wheel, {"numpy/__init__.py": ""}, version="0.0.2")
    result = three_patches.run("fetch", "--upstream", "0.0.2", "--wheel", str(wheel))
    assert result.code == 4
    assert "is not an sglang wheel" in result.err and "numpy" in result.err
    assert "[layout]" not in result.err


def test_series_with_crlf_and_trailing_blanks_is_normalised_and_reported(
    three_patches: Project,
) -> None:
    """Item 8."""
    series = three_patches.patches / "series"
    clean = series.read_bytes()
    series.write_bytes(
        clean.replace(b"\n", b"\r\n").replace(b".patch\r", b".patch  \r")
    )
    assert three_patches.run("apply").code == 0  # read as if clean
    check = three_patches.run("check")
    assert check.code == 1 and "ends in CRLF" in check.err
    assert three_patches.run("refresh").code == 0
    assert series.read_bytes() == clean


def test_apply_keeps_an_exported_but_uncommitted_head(three_patches: Project) -> None:
    """Item 9: commits exported by refresh but not committed in the project."""
    before = snapshot(three_patches.patches)
    three_patches.commit_change(
        "python/sglang/srt/new.py", "X = 1\n", "[XPU] Exported only",
        Upstream_Status="Pending", Concern="exported-only", Origin="other, test",
    )  # fmt: skip
    assert three_patches.run("refresh").code == 0
    head = git(three_patches.tree, "rev-parse", "HEAD")
    # The user throws away the exported files (e.g. git checkout patches/).
    shutil.rmtree(three_patches.patches)
    three_patches.patches.mkdir()
    for name, data in before.items():
        (three_patches.patches / name).write_bytes(data)
    result = three_patches.run("apply", "--json")
    assert result.code == 0, result.err
    notes = " ".join(json.loads(result.out)["notes"])
    branch = next(w for w in notes.split() if w.startswith("xpu-series/backup-"))
    assert git(three_patches.tree, "rev-parse", branch) == head
    # An apply that changes nothing keeps no backup.
    again = three_patches.run("apply", "--json")
    assert "backup" not in " ".join(json.loads(again.out)["notes"])
