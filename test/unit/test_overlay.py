"""overlay: the series written into an installed sglang, checked first, all or
nothing, undoable byte for byte, and consistent for pip."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import Project, git, interrupt

from xpu_series.overlay.installed import JOURNAL, record_hash
from xpu_series.stack.hunks import blob_id, parse_patch


def install_wheel(site: Path, wheel: Path) -> Path:
    """Unpack a wheel into `site` and write the RECORD pip would write."""
    site.mkdir(parents=True, exist_ok=True)
    rows = []
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            data = zf.read(info)
            target = site / info.filename
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            if not info.filename.endswith("/RECORD"):
                rows.append([info.filename, record_hash(data), str(len(data))])
    dist = next(site.glob("sglang-*.dist-info"))
    rows.append([f"{dist.name}/RECORD", "", ""])
    with open(dist / "RECORD", "w", newline="") as fh:
        csv.writer(fh, lineterminator="\n").writerows(rows)
    return dist


def snapshot(site: Path) -> dict[str, str]:
    """sha256 of every file under `site` (the journal and temp files included)."""
    return {
        p.relative_to(site).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(site.rglob("*"))
        if p.is_file()
    }


def record_matches(site: Path) -> None:
    """Every RECORD row names a file that exists with that hash and size, and every
    file in the dist-info's care is listed (what pip uninstall relies on)."""
    dist = next(site.glob("sglang-*.dist-info"))
    listed = set()
    with open(dist / "RECORD", newline="") as fh:
        for path, digest, size in csv.reader(fh):
            listed.add(path)
            if not digest:
                continue
            data = (site / path).read_bytes()
            assert record_hash(data) == digest, path
            assert len(data) == int(size), path
    on_disk = {p.relative_to(site).as_posix() for p in site.rglob("*") if p.is_file()}
    assert on_disk == listed


@pytest.fixture
def site(three_patches: Project, tmp_path: Path) -> Path:
    site = tmp_path / "site"
    install_wheel(site, three_patches.wheel)
    return site


def version_of(site: Path) -> str:
    meta = next(site.glob("sglang-*.dist-info")) / "METADATA"
    line = next(x for x in meta.read_text().splitlines() if x.startswith("Version:"))
    return line.split(":", 1)[1].strip()


def test_overlay_writes_the_tree_and_undo_gives_every_byte_back(
    three_patches: Project, site: Path
) -> None:
    before = snapshot(site)
    result = three_patches.run("overlay", "--into", str(site))
    assert result.code == 0, result.err
    tree = three_patches.tree / "python"
    for rel in ("sglang/srt/flags.py", "sglang/srt/other.py", "sglang/srt/third.py"):
        assert (site / rel).read_bytes() == (tree / rel).read_bytes()
    untouched = "sglang/srt/long.py"
    assert snapshot(site)[untouched] == before[untouched]
    assert version_of(site).startswith("0.0.1+xpu.s")
    record_matches(site)
    assert not (site / JOURNAL).exists()

    status = three_patches.run("--json", "overlay", "--status", "--into", str(site))
    data = json.loads(status.out)
    assert status.code == 0
    prov = data["provenance"]
    assert prov["release"] == "0.0.1"
    assert [p["name"][:4] for p in prov["patches"]] == ["0001", "0002", "0003"]
    series_bytes = (three_patches.patches / "0001-raise-value.patch").read_bytes()
    assert prov["patches"][0]["sha256"] == hashlib.sha256(series_bytes).hexdigest()
    assert {f["state"] for f in data["files"]} == {"intact"}

    undo = three_patches.run("overlay", "--undo", "--into", str(site))
    assert undo.code == 0, undo.err
    assert snapshot(site) == before


def test_a_second_overlay_is_a_no_op(three_patches: Project, site: Path) -> None:
    assert three_patches.run("overlay", "--into", str(site)).code == 0
    once = snapshot(site)
    mtimes = {p: p.stat().st_mtime_ns for p in site.rglob("*") if p.is_file()}
    again = three_patches.run("overlay", "--into", str(site))
    assert again.code == 0
    assert "already overlaid" in again.out
    assert snapshot(site) == once
    assert {p: p.stat().st_mtime_ns for p in site.rglob("*") if p.is_file()} == mtimes


def test_a_target_without_sglang_is_refused(
    three_patches: Project, tmp_path: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = three_patches.run("overlay", "--into", str(empty))
    assert result.code == 2
    assert "holds no installed sglang" in result.err
    assert "--python" in result.err
    assert list(empty.iterdir()) == []


def test_another_sglang_version_is_refused(three_patches: Project, site: Path) -> None:
    before = snapshot(site)
    result = three_patches.run("overlay", "--into", str(site), "--upstream", "0.0.2")
    assert result.code == 4
    assert "has sglang 0.0.1, not 0.0.2" in result.err
    meta = next(site.glob("sglang-*.dist-info")) / "METADATA"
    meta.write_text(meta.read_text().replace("0.0.1", "0.0.9"))
    before = snapshot(site)
    result = three_patches.run("overlay", "--into", str(site))
    assert result.code == 4
    assert "serves sglang 0.0.1 to 0.0.1" in result.err
    assert snapshot(site) == before


def test_a_file_edited_by_hand_is_named_and_nothing_is_written(
    three_patches: Project, site: Path
) -> None:
    (site / "sglang/srt/other.py").write_text("def answer():\n    return 7\n")
    (site / "sglang/srt/third.py").unlink()
    before = snapshot(site)
    result = three_patches.run("overlay", "--into", str(site))
    assert result.code == 4
    assert "sglang/srt/other.py (differs from sglang 0.0.1)" in result.err
    assert "sglang/srt/third.py (missing)" in result.err
    assert "flags.py" not in result.err
    assert snapshot(site) == before


def _read_only(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI against `site` made read-only: by mode for a normal user, by a
    read-only bind mount in a user namespace for root (root ignores modes)."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2] / "python"))
    cli = [sys.executable, "-m", "xpu_series", *args]
    if os.geteuid() != 0:
        for path in [site, *site.rglob("*")]:
            path.chmod(path.stat().st_mode & ~0o222)
        try:
            return subprocess.run(cli, env=env, capture_output=True, text=True)
        finally:
            for path in [site, *site.rglob("*")]:
                path.chmod(path.stat().st_mode | stat.S_IWUSR)
    if not shutil.which("unshare"):
        pytest.skip("running as root and no unshare(1) for a read-only mount")
    script = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, str(site), "true"], capture_output=True
    )
    if probe.returncode != 0:
        pytest.skip("running as root and this kernel refuses a read-only bind mount")
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, str(site), *cli],
        env=env,
        capture_output=True,
        text=True,
    )


def test_a_read_only_target_is_refused_before_anything_is_written(
    three_patches: Project, site: Path
) -> None:
    before = snapshot(site)
    result = _read_only(
        site, "-C", str(three_patches.root), "overlay", "--into", str(site)
    )
    assert result.returncode == 1, result.stderr
    assert "is not writable: nothing was written" in result.stderr
    assert snapshot(site) == before


@pytest.mark.parametrize(
    "where,sig", [("stage2", "SIGINT"), ("commit", "SIGKILL"), ("entry2", "SIGKILL")]
)
@pytest.mark.parametrize("then", ["rerun", "undo"])
def test_an_interrupt_at_any_point_ends_clean_after_a_rerun_or_undo(
    three_patches: Project, site: Path, tmp_path: Path, where: str, sig: str, then: str
) -> None:
    original = snapshot(site)
    clean = tmp_path / "clean"
    install_wheel(clean, three_patches.wheel)
    assert three_patches.run("overlay", "--into", str(clean)).code == 0
    overlaid = snapshot(clean)
    proc = interrupt(three_patches, where, "overlay", "--into", str(site), sig=sig)
    assert proc.returncode != 0
    if where == "stage2":
        assert snapshot(site) == {
            **original,
            **{k: v for k, v in snapshot(site).items() if k.startswith(JOURNAL)},
        }
    if then == "rerun":
        result = three_patches.run("overlay", "--into", str(site))
        assert result.code == 0, result.err
        assert snapshot(site) == overlaid
    else:
        result = three_patches.run("overlay", "--undo", "--into", str(site))
        assert result.code == 0, result.err
        assert snapshot(site) == original


def test_ctrl_c_during_the_write_is_held_until_the_write_is_whole(
    three_patches: Project, site: Path
) -> None:
    proc = interrupt(three_patches, "entry1", "overlay", "--into", str(site))
    assert proc.returncode == 1
    assert "interrupted" in proc.stderr
    assert not (site / JOURNAL).exists()
    # Following the hint ('run the same command again') finds the whole overlay.
    again = three_patches.run("overlay", "--into", str(site))
    assert again.code == 0 and "already overlaid" in again.out
    status = three_patches.run("overlay", "--status", "--into", str(site))
    assert "files: 3 of 3 intact" in status.out


def test_an_overlay_of_another_series_is_refused_and_the_hint_works(
    three_patches: Project, site: Path
) -> None:
    original = snapshot(site)
    assert three_patches.run("overlay", "--into", str(site)).code == 0
    three_patches.add_patch(
        "python/sglang/srt/long.py", "LINE_1 = 100\n", "[XPU] Shorten long"
    )
    before = snapshot(site)
    result = three_patches.run("overlay", "--into", str(site))
    assert result.code == 1
    assert "already has an overlay of another series" in result.err
    assert snapshot(site) == before
    hint = result.err.split("hint: run '", 1)[1].split("'", 1)[0]
    assert three_patches.run(*hint.split()[1:]).code == 0
    assert snapshot(site) == original
    assert three_patches.run("overlay", "--into", str(site)).code == 0
    assert (site / "sglang/srt/long.py").read_text() == "LINE_1 = 100\n"
    record_matches(site)


def test_undo_with_nothing_to_undo_changes_nothing(
    three_patches: Project, site: Path
) -> None:
    before = snapshot(site)
    result = three_patches.run("overlay", "--undo", "--into", str(site))
    assert result.code == 0
    assert "nothing to undo" in result.out
    assert snapshot(site) == before


def test_a_target_without_record_is_refused_and_the_hint_works(
    three_patches: Project, site: Path
) -> None:
    dist = next(site.glob("sglang-*.dist-info"))
    (dist / "RECORD").unlink()
    before = snapshot(site)
    result = three_patches.run("overlay", "--into", str(site))
    assert result.code == 1
    assert "has no RECORD" in result.err
    assert "reinstall sglang with pip" in result.err
    assert snapshot(site) == before
    install_wheel(site, three_patches.wheel)  # the reinstall the hint asks for
    assert three_patches.run("overlay", "--into", str(site)).code == 0
    record_matches(site)


def test_edits_after_the_overlay_are_reported_and_undo_keeps_them_unless_forced(
    three_patches: Project, site: Path
) -> None:
    original = snapshot(site)
    assert three_patches.run("overlay", "--into", str(site)).code == 0
    edited = site / "sglang/srt/flags.py"
    edited.write_text("VALUE = 99\n")
    status = three_patches.run("overlay", "--status", "--into", str(site))
    assert status.code == 1
    assert "changed since the overlay: sglang/srt/flags.py" in status.err
    undo = three_patches.run("overlay", "--undo", "--into", str(site))
    assert undo.code == 1
    assert "sglang/srt/flags.py" in undo.err
    assert edited.read_text() == "VALUE = 99\n"
    hint = undo.err.split("then run '", 1)[1].split("'", 1)[0]
    assert three_patches.run(*hint.split()[1:]).code == 0
    assert snapshot(site) == original


def test_python_names_the_install_instead_of_a_folder(
    three_patches: Project, site: Path, tmp_path: Path
) -> None:
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    result = three_patches.run("overlay", "--python", str(python))
    assert result.code == 0, result.err
    status = three_patches.run("overlay", "--status", "--python", str(python))
    assert "files: 3 of 3 intact" in status.out
    bare = tmp_path / "bare"
    bare.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    bare.chmod(0o755)
    missing = three_patches.run("overlay", "--python", str(bare))
    assert missing.code == 2 and "does not import sglang" in missing.err
    tree = three_patches.tree / "python"
    linked = tmp_path / "linked"
    linked.write_text(f'#!/bin/sh\nPYTHONPATH="{tree}" exec "{sys.executable}" "$@"\n')
    linked.chmod(0o755)
    source = three_patches.run("overlay", "--python", str(linked))
    assert source.code == 2 and "not an installed distribution" in source.err


def test_the_hunk_applier_keeps_a_missing_final_newline(tmp_path: Path) -> None:
    before = b"a\nb\nc"
    after = b"a\nB\nc"
    text = (
        "diff --git a/x.py b/x.py\n"
        f"index {blob_id(before)}..{blob_id(after)} 100644\n"
        "--- a/x.py\n+++ b/x.py\n"
        "@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n\\ No newline at end of file\n"
    )
    (diff,) = parse_patch(text)
    from xpu_series.stack.hunks import apply_diff

    assert apply_diff(diff, before, "p") == after


def test_an_older_served_release_gets_the_series_as_it_applies_there(
    three_patches: Project, tmp_path: Path
) -> None:
    """Moved to 0.0.2 (where other.py gained a line above the patched one), the
    series still serves 0.0.1: its overlay needs the exported 0.0.1 diff, says so,
    and the hint writes it; a later change to the series makes it stale again."""
    from test_rebase import newer

    wheel = newer(tmp_path, other="# moved\ndef answer():\n    return 41\n")
    assert (
        three_patches.run("rebase", "--onto", "0.0.2", "--wheel", str(wheel)).code == 0
    )
    toml = three_patches.patches / "upstream.toml"
    toml.write_text(
        toml.read_text().replace("[upstream]\n", '[upstream]\nserves-from = "0.0.1"\n')
    )
    old = tmp_path / "old-site"
    install_wheel(old, three_patches.wheel)
    before = snapshot(old)
    refused = three_patches.run("overlay", "--into", str(old))
    assert refused.code == 4
    assert "patches/overlay/0.0.1.diff does not exist" in refused.err
    assert snapshot(old) == before
    hint = refused.err.split("hint: run '", 1)[1].split("'", 1)[0]
    assert three_patches.run(*hint.split()[1:]).code == 0
    check = three_patches.run("overlay", "--export", "0.0.1", "--check")
    assert check.code == 0 and "is current" in check.out
    assert three_patches.run("overlay", "--into", str(old)).code == 0
    assert (old / "sglang/srt/other.py").read_text() == "def answer():\n    return 42\n"
    assert version_of(old).startswith("0.0.1+xpu.s")
    record_matches(old)
    assert three_patches.run("overlay", "--undo", "--into", str(old)).code == 0
    assert snapshot(old) == before
    three_patches.add_patch(
        "python/sglang/srt/long.py", "LINE_1 = 5\n", "[XPU] Cut long"
    )
    stale = three_patches.run("overlay", "--into", str(old))
    assert stale.code == 4 and "exported from another series" in stale.err
    assert three_patches.run("overlay", "--export", "0.0.1", "--check").code == 1
    assert snapshot(old) == before


# How sglang finds its plugins: the entry points of the group, each one called.
LOAD_PLUGINS = """
from importlib.metadata import entry_points
found = entry_points(group="sglang.srt.plugins")
print(sorted(f"{ep.name} = {ep.value}" for ep in found))
for ep in found:
    ep.load()()
"""


def load_plugins(site: Path) -> subprocess.CompletedProcess[str]:
    """The plugins `site` registers, loaded and called by a Python that sees
    nothing else (-S); bytecode is written, as a server's imports write it."""
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return subprocess.run(
        [sys.executable, "-S", "-c", LOAD_PLUGINS],
        env=env, capture_output=True, text=True, timeout=60, cwd=site,
    )  # fmt: skip


def add_to_install(site: Path, rel: str, data: bytes) -> None:
    """A file the install already had, listed in its RECORD as pip lists it."""
    (site / rel).write_bytes(data)
    record = next(site.glob("sglang-*.dist-info")) / "RECORD"
    rows = list(csv.reader(record.read_text().splitlines()))
    rows.insert(-1, [rel, record_hash(data), str(len(data))])
    with open(record, "w", newline="") as fh:
        csv.writer(fh, lineterminator="\n").writerows(rows)


def wheel_record(said: str) -> dict:
    """The series record in the wheel that `wheel --json` said it built."""
    with zipfile.ZipFile(json.loads(said)["path"]) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/xpu_series.json")]
        return json.loads(zf.read(name))


@pytest.mark.parametrize("had_entry_points", [False, True])
def test_the_overlay_registers_the_plugin_and_undo_takes_it_away(
    three_patches: Project, site: Path, had_entry_points: bool
) -> None:
    dist = next(site.glob("sglang-*.dist-info")).name
    theirs = b"[console_scripts]\nsglang = sglang.cli:main\n"
    if had_entry_points:
        add_to_install(site, f"{dist}/entry_points.txt", theirs)
    before = snapshot(site)
    assert load_plugins(site).stdout == "[]\n"
    assert three_patches.run("overlay", "--into", str(site)).code == 0
    record_matches(site)
    status = three_patches.run("--json", "overlay", "--status", "--into", str(site))
    sha = json.loads(status.out)["provenance"]["series_sha256"]
    loaded = load_plugins(site)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout == "['xpu_series = sglang_xpu_series:announce']\n"
    (line,) = loaded.stderr.splitlines()
    assert line.endswith(
        f"sglang-xpu: series s{sha[:12]} (3 patches, series sha256 {sha}) on "
        f"sglang {version_of(site)}"
    )
    entry_points = (site / dist / "entry_points.txt").read_bytes()
    assert entry_points.startswith(theirs if had_entry_points else b"[sglang.srt")
    assert list((site / "sglang_xpu_series" / "__pycache__").glob("*.pyc"))

    undo = three_patches.run("overlay", "--undo", "--into", str(site))
    assert undo.code == 0, undo.err
    assert snapshot(site) == before
    assert not (site / "sglang_xpu_series").exists()
    assert load_plugins(site).stdout == "[]\n"


def test_the_overlays_plugin_reads_what_the_fork_wheel_records(
    three_patches: Project, site: Path, tmp_path: Path
) -> None:
    """The same module and the same file hashes as the fork wheel of the series;
    a patched file edited after the overlay is named by the plugin."""
    assert three_patches.run("overlay", "--into", str(site)).code == 0
    built = three_patches.run("--json", "wheel", "--out", str(tmp_path / "wheel"))
    assert built.code == 0, built.err
    with zipfile.ZipFile(json.loads(built.out)["path"]) as zf:
        module = zf.read("sglang_xpu_series/__init__.py")
    recorded = wheel_record(built.out)
    dist = next(site.glob("sglang-*.dist-info"))
    record = json.loads((dist / "xpu_series.json").read_text())
    assert (site / "sglang_xpu_series/__init__.py").read_bytes() == module
    assert record["files"] == recorded["files"]
    for key in ("series_sha256", "version", "patches", "plugin"):
        assert record[key] == recorded[key], key
    (site / "sglang/srt/third.py").write_text("LIMIT = 11\n")
    line, warning = load_plugins(site).stderr.splitlines()
    assert "sglang-xpu: series s" in line
    assert "sglang/srt/third.py differs from the series' file" in warning


def test_the_overlay_and_the_wheel_record_the_same_revision(
    three_patches: Project, site: Path, tmp_path: Path
) -> None:
    """Both record the project's git HEAD, and say when patches/ differs from it."""
    root = three_patches.root
    (root / ".gitignore").write_text("build/\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "series")
    head = git(root, "rev-parse", "HEAD")
    assert three_patches.run("overlay", "--into", str(site)).code == 0
    dist = next(site.glob("sglang-*.dist-info"))
    overlaid = json.loads((dist / "xpu_series.json").read_text())
    built = three_patches.run("--json", "wheel", "--out", str(tmp_path / "clean"))
    for record in (overlaid, wheel_record(built.out)):
        assert (record["revision"], record["revision_dirty"]) == (head, False)
    series = three_patches.patches / "series"
    series.write_text(series.read_text() + "# a note\n")
    built = three_patches.run("--json", "wheel", "--out", str(tmp_path / "dirty"))
    recorded = wheel_record(built.out)
    assert (recorded["revision"], recorded["revision_dirty"]) == (head, True)
