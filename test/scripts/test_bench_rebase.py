"""bench_rebase: it times a move the series really made, found in patches/moves/ and
git history, so its default is a rebase that can run."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest
from conftest import load_script

bench = load_script("bench_rebase.py")
ROOT = Path(__file__).resolve().parents[2]


def _commit(repo: Path, files: dict[str, str], message: str) -> str:
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", message], check=True)
    return subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip


def _pin(version: str) -> str:
    return f'[upstream]\nproject = "sglang"\nversion = "{version}"\n'


@pytest.fixture
def history(tmp_path: Path) -> Path:
    """A series on 0.0.1, then one commit that moved it 0.0.1 -> 0.0.2 -> 0.0.3."""
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    series = {"patches/upstream.toml": _pin("0.0.1"),
              "patches/series": "0001-a.patch\n0002-b.patch\n"}  # fmt: skip
    _commit(repo, series, "series")
    _commit(repo, {"patches/upstream.toml": _pin("0.0.3"),
                   "patches/series": "0001-a.patch\n",
                   "patches/moves/0.0.1-to-0.0.2.plan": "# none\n",
                   "patches/moves/0.0.2-to-0.0.3.plan": "drop 0002-b.patch gone\n",
                   "patches/resolutions/0001-a.patch/x.patch": "by hand\n"},
            "move")  # fmt: skip
    return repo


def test_the_default_is_the_last_move_and_it_starts_where_history_says(
    history: Path,
) -> None:
    moves = bench.recorded_moves(history)
    assert [(m.old, m.new) for m in moves] == [("0.0.1", "0.0.2"), ("0.0.2", "0.0.3")]
    move = bench.pick_move(moves, bench.parse_args([]).onto)
    assert (move.old, move.new) == ("0.0.2", "0.0.3")
    files, before = bench.start_of(history, move)
    # The parent's series, with the move's plans and resolutions laid over it...
    assert b'version = "0.0.1"' in files["patches/upstream.toml"]
    assert files["patches/series"] == b"0001-a.patch\n0002-b.patch\n"
    assert files["patches/resolutions/0001-a.patch/x.patch"] == b"by hand\n"
    # ...carried through the earlier plan of the same commit to where the move starts.
    assert [(m.old, m.new) for m in before] == [("0.0.1", "0.0.2")]
    assert bench.decided(history / move.plan) == {"0002-b.patch"}
    first = bench.pick_move(moves, "0.0.2")
    assert bench.start_of(history, first)[1] == []


def test_quick_takes_the_last_move_that_needs_no_carry(history: Path) -> None:
    moves = bench.recorded_moves(history)
    quick = bench.parse_args(["--quick"])
    move = bench.pick_move(moves, quick.onto, quick.quick)
    assert (move.old, move.new) == ("0.0.1", "0.0.2")
    assert bench.start_of(history, move)[1] == []
    # A later move of a commit of its own is the first of that commit.
    _commit(history, {"patches/moves/0.0.3-to-0.0.4.plan": "# x\n"}, "next move")
    move = bench.pick_move(bench.recorded_moves(history), None, True)
    assert (move.old, move.new) == ("0.0.3", "0.0.4")
    # --onto still names the move, quick or not.
    assert bench.pick_move(moves, "0.0.3", True).old == "0.0.2"


def test_a_move_not_recorded_is_refused_with_the_ones_that_are(history: Path) -> None:
    moves = bench.recorded_moves(history)
    with pytest.raises(SystemExit) as refused:
        bench.pick_move(moves, "0.0.1")
    assert "no recorded move onto sglang 0.0.1" in str(refused.value)
    assert "0.0.1 -> 0.0.2, 0.0.2 -> 0.0.3" in str(refused.value)
    assert "hint:" in str(refused.value)
    with pytest.raises(SystemExit, match="records no move"):
        bench.pick_move([], None)


def test_a_chain_that_does_not_reach_the_move_is_refused(history: Path) -> None:
    # The pin before the move commit is not where its first plan starts.
    _commit(history, {"patches/upstream.toml": _pin("0.0.9")}, "unrelated")
    (history / "patches/moves/0.0.2-to-0.0.3.plan").unlink()
    moved = _commit(history, {"patches/moves/0.0.3-to-0.0.4.plan": "# x\n"}, "move")
    move = bench.pick_move(bench.recorded_moves(history), None)
    assert (move.commit, move.new) == (moved, "0.0.4")
    with pytest.raises(SystemExit, match="starts on sglang 0.0.9"):
        bench.start_of(history, move)


def test_the_checkouts_default_moves_onto_the_pin_from_below() -> None:
    """The bench's default on this checkout is a rebase `rebase` accepts: onto the
    pin, from an older release reached from history (it was onto 0.5.20, below the
    pin, a move the tool never made)."""
    pin = tomllib.loads((ROOT / "patches/upstream.toml").read_text())["upstream"]
    move = bench.pick_move(bench.recorded_moves(ROOT), bench.parse_args([]).onto)
    assert move.new == pin["version"]
    older = bench.version_tuple(move.old)
    assert older is not None and older < bench.version_tuple(pin["version"])
    files, before = bench.start_of(ROOT, move)
    assert bench._pin_version(files) == (before[0].old if before else move.old)
    assert (ROOT / move.plan).is_file()
