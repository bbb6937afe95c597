"""scripts/check_overlay.py and check_wheel.py: which patches' fast tests the
installs run."""

from __future__ import annotations

import pytest
from conftest import load_script

from xpu_series.project import Project


@pytest.fixture(scope="module")
def wheel():
    # check_wheel runs check_overlay's sample: one choice for both installs.
    module = load_script("check_wheel.py")
    assert module.sampled_tests.__module__ == "check_overlay"
    return module


def test_the_install_runs_a_seeded_sample_or_every_patchs_tests(
    wheel, monkeypatch: pytest.MonkeyPatch
) -> None:
    patches = [p for p in Project(wheel.ROOT).series().patches if p.header.fast_tests]
    every = {t for p in patches for t in p.header.fast_tests}
    monkeypatch.delenv("XPU_SERIES_PROVE_ALL", raising=False)
    monkeypatch.delenv("XPU_SERIES_PROOF_SAMPLE", raising=False)
    picks = {}
    for seed in range(1, 8):
        monkeypatch.setenv("XPU_SERIES_PROOF_SEED", str(seed))
        tests, which = wheel.sampled_tests()
        # The seed repeats the choice, and the line says how.
        assert wheel.sampled_tests() == (tests, which)
        assert f"XPU_SERIES_PROOF_SEED={seed} repeats it" in which
        named = [p for p in patches if p.name[:4] in which]
        assert len(named) == 2
        assert set(tests) == {t for p in named for t in p.header.fast_tests}
        picks[seed] = tuple(tests)
    # Another seed, another sample; never every patch's.
    assert len(set(picks.values())) > 1 and all(set(t) < every for t in picks.values())
    monkeypatch.setenv("XPU_SERIES_PROVE_ALL", "1")
    tests, which = wheel.sampled_tests()
    assert set(tests) == every and which == "every patch"
