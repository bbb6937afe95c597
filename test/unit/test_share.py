"""link_settled: another project shares the cache while its writers work."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from xpu_series.proofs.proof import store_json
from xpu_series.stack import share


def test_settled_entries_are_linked_and_staging_ones_left_out(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "wheels" / "ab12").mkdir(parents=True)
    (cache / "wheels" / "ab12" / "sglang-1.whl").write_bytes(b"wheel")
    (cache / "wheels" / "ab12" / ".sglang-2.whl.part").write_bytes(b"half")
    (cache / "wheels" / ".download-x1").mkdir()
    (cache / "wheels" / ".download-x1" / "sglang-3.whl").write_bytes(b"half")
    (cache / "outcomes").mkdir()
    (cache / "outcomes" / "k1.json").write_text("{}")
    (cache / "outcomes" / ".k2.tmp").write_text("{")
    dest = tmp_path / "other" / "cache"

    assert share.link_settled(cache / "wheels", dest / "wheels") == 1
    assert share.link_settled(cache / "outcomes", dest / "outcomes") == 1
    linked = sorted(str(p.relative_to(dest)) for p in dest.rglob("*"))
    assert linked == [
        "outcomes", "outcomes/k1.json", "wheels", "wheels/ab12",
        "wheels/ab12/sglang-1.whl",
    ]  # fmt: skip
    original = cache / "wheels" / "ab12" / "sglang-1.whl"
    assert os.path.samefile(original, dest / "wheels" / "ab12" / "sglang-1.whl")
    assert share.link_settled(cache / "bases", dest / "bases") == 0
    assert not (dest / "bases").exists()


def test_across_filesystems_a_settled_entry_is_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache" / "bases"
    (cache / "k1").mkdir(parents=True)
    (cache / "k1" / "pack").write_bytes(b"objects")
    (cache / ".k2.tmp").write_bytes(b"half")

    def no_link(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(share.os, "link", no_link)
    dest = tmp_path / "tmpfs" / "bases"
    assert share.link_settled(cache, dest) == 1
    assert (dest / "k1" / "pack").read_bytes() == b"objects"
    assert not os.path.samefile(cache / "k1" / "pack", dest / "k1" / "pack")
    assert not (dest / ".k2.tmp").exists()

    def refused(*args: object, **kwargs: object) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(share.os, "link", refused)  # no other error is hidden
    with pytest.raises(PermissionError):
        share.link_settled(cache, tmp_path / "again")


def test_an_entry_gone_between_listing_and_link_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    for name in ("a.json", "b.json", "c.json"):
        (cache / name).write_text(name)
    real_link = os.link

    def replaced_first(src: str, dst: str, **kw: bool) -> None:
        # A writer replaces b.json the moment after the listing saw it.
        if src.endswith("b.json"):
            os.unlink(src)
        real_link(src, dst, **kw)

    monkeypatch.setattr(share.os, "link", replaced_first)
    assert share.link_settled(cache, tmp_path / "dest") == 2
    assert sorted(p.name for p in (tmp_path / "dest").iterdir()) == [
        "a.json",
        "c.json",
    ]


def test_sharing_while_the_proofs_store_outcomes_never_fails(tmp_path: Path) -> None:
    """What CI's benchmarks do beside verify and the matrix: `cp -al` failed here
    on a `.KEY.tmp` renamed away mid-copy."""
    cache = tmp_path / "outcomes"
    for i in range(300):
        store_json(cache, f"settled{i}", {"outcomes": {"t": "passed"}})
    done = threading.Event()

    def writer() -> None:
        i = 0
        while not done.is_set():
            store_json(cache, f"new{i}", {"outcomes": {"t": "passed"}})
            i += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for round_ in range(20):
            dest = tmp_path / f"copy{round_}"
            share.link_settled(cache, dest)
            names = {p.name for p in dest.iterdir()}
            assert {f"settled{i}.json" for i in range(300)} <= names
            assert not [n for n in names if n.startswith(".")]
    finally:
        done.set()
        thread.join()
