"""The record of each patch's last full proof (patches/proofs.json): what a run
proves, re-proves and trusts, what invalidates a record, and when a run fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import Project

from xpu_series.proofs.record import sample


def _write_test(project: Project, name: str, body: str) -> str:
    path = project.root / "test" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(body)
    return f"test/{name}"


@pytest.fixture
def verified(project: Project) -> Project:
    """One patch that raises VALUE, with a test that fails without it."""
    value = _write_test(
        project,
        "test_value.py",
        "from sglang.srt.flags import VALUE\n\n"
        "def test_value():\n    assert VALUE == 2\n",
    )
    project.add_patch(
        "python/sglang/srt/flags.py",
        "VALUE = 2\nNAME = 'upstream'\n",
        "[XPU] Raise VALUE",
        Tests=value,
    )
    return project


@pytest.fixture
def tested(verified: Project) -> Project:
    """Three patches with tests, one of them importing a helper from another
    folder of test/."""
    helper = verified.root / "test" / "helpers" / "limits.py"
    helper.parent.mkdir(parents=True)
    helper.write_text("EXPECTED = 42\n")
    answer = _write_test(
        verified,
        "test_answer.py",
        "import sys\nfrom pathlib import Path\n\n"
        "sys.path.insert(0, str(Path(__file__).parent / 'helpers'))\n"
        "from limits import EXPECTED  # noqa: E402\n"
        "from sglang.srt.other import answer  # noqa: E402\n\n"
        "def test_answer():\n    assert answer() == EXPECTED\n",
    )
    verified.add_patch(
        "python/sglang/srt/other.py",
        "def answer():\n    return 42\n",
        "[XPU] Fix the answer",
        Tests=answer,
    )
    limit = _write_test(
        verified,
        "test_limit.py",
        "from sglang.srt.third import LIMIT\n\n"
        "def test_limit():\n    assert LIMIT == 20\n",
    )
    verified.add_patch(
        "python/sglang/srt/third.py", "LIMIT = 20\n", "[XPU] Raise LIMIT", Tests=limit
    )
    return verified


@pytest.fixture
def recorded(tested: Project, monkeypatch: pytest.MonkeyPatch) -> Project:
    """The three patches and a record of their full proofs."""
    # Off CI, and a known sample: one unchanged patch per run.
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("XPU_SERIES_PROVE_ALL", raising=False)
    monkeypatch.setenv("XPU_SERIES_PROOF_SAMPLE", "1")
    done = tested.run("verify", "--record")
    assert done.code == 0, done.out + done.err
    assert "recorded 3 patch(es) in patches/proofs.json" in done.err
    return tested


def _sources(project: Project, *args: str) -> tuple[int, dict[str, str], str]:
    result = project.run("verify", "--json", *args)
    data = json.loads(result.out)
    return (
        result.code,
        {p["name"][:4]: p["source"] for p in data["patches"]},
        result.err,
    )


def test_an_unchanged_series_is_spot_checked_by_a_seeded_sample(
    recorded: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = json.loads((recorded.patches / "proofs.json").read_text())
    assert sorted(record["patches"]) == [
        "0001-raise-value.patch", "0002-fix-the-answer.patch",
        "0003-raise-limit.patch",
    ]  # fmt: skip
    kept = record["patches"]["0001-raise-value.patch"]["verify"]["result"]
    assert kept["verdict"] == "proven" and kept["without"]["failed"] == 1
    names = sorted(record["patches"])
    # Two seeds that choose differently (the choice is the library's sample()):
    # each run re-proves what its seed chose, and says the seed.
    picks = {seed: sample(seed, names, 1) for seed in range(1, 30)}
    first = 1
    second = next(k for k, pick in picks.items() if pick != picks[first])
    for seed in (first, second):
        monkeypatch.setenv("XPU_SERIES_PROOF_SEED", str(seed))
        code, sources, err = _sources(recorded)
        assert code == 0, err
        # One re-proven, the others stand on their record; the seed is told.
        assert sorted(sources.values()) == ["re-proven", "record", "record"]
        again = [n for n, s in sources.items() if s == "re-proven"]
        assert [n[:4] for n in picks[seed]] == again
        assert f"re-proving {again[0]} of 3 unchanged (seed {seed}; " in err
        assert f"XPU_SERIES_PROOF_SEED={seed} repeats the choice" in err
    # The same seed, the same choice.
    assert _sources(recorded)[1] == sources
    # Over many seeds every patch gets its turn.
    assert {pick[0] for pick in picks.values()} == set(names)
    # --all (or XPU_SERIES_PROVE_ALL=1, what the weekly workflow sets) re-proves
    # every patch, and each agrees with its record.
    code, sources, _err = _sources(recorded, "--all")
    assert code == 0 and set(sources.values()) == {"re-proven"}
    monkeypatch.setenv("XPU_SERIES_PROVE_ALL", "1")
    assert set(_sources(recorded)[1].values()) == {"re-proven"}


def test_a_re_proof_that_disagrees_with_its_record_fails_the_run(
    recorded: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = recorded.patches / "proofs.json"
    record = json.loads(path.read_text())
    # The record says two tests failed without 0003; they measure one.
    kept = record["patches"]["0003-raise-limit.patch"]["verify"]["result"]
    kept["without"]["failed"] = 2
    path.write_text(json.dumps(record))
    # A sample that misses it trusts the record as it is: that is the deal.
    monkeypatch.setenv("XPU_SERIES_PROOF_SAMPLE", "0")
    code, sources, _err = _sources(recorded)
    assert code == 0 and sources["0003"] == "record"
    monkeypatch.setenv("XPU_SERIES_PROOF_SAMPLE", "1")
    # A run whose sample meets it fails, and says what differs.
    names = sorted(record["patches"])
    seed = next(k for k in range(1, 99) if sample(k, names, 1)[0].startswith("0003"))
    monkeypatch.setenv("XPU_SERIES_PROOF_SEED", str(seed))
    code, sources, err = _sources(recorded)
    assert sources["0003"] == "re-proven" and code == 1
    assert (
        "error: 0003-raise-limit.patch: the re-proof disagrees with its record: "
        "recorded proven (without: 0 passed, 2 failed; with: 1 passed, 0 failed), "
        "now proven (without: 0 passed, 1 failed; with: 1 passed, 0 failed)"
    ) in err
    assert "'xpu-series verify --all --record' writes the record anew" in err
    # The hint, followed: the record is written anew, and the runs agree again.
    assert recorded.run("verify", "--all", "--record").code == 0
    assert recorded.run("verify", "--all").code == 0


def test_a_stale_record_is_proven_in_full_and_fails_in_ci(
    recorded: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XPU_SERIES_PROOF_SAMPLE", "0")
    helper = recorded.root / "test" / "helpers" / "limits.py"
    helper.write_text("EXPECTED = 42  # the answer\n")
    code, sources, err = _sources(recorded)
    # Only the patch whose tests import the helper is proven again.
    assert code == 0, err
    assert sources == {"0001": "record", "0002": "ran", "0003": "record"}
    assert "proving 0002 (changed: tests)" in err
    assert "note: the record of 1 patch(es) is stale or missing" in err
    # In CI a stale record is an error, with the way out.
    monkeypatch.setenv("CI", "true")
    result = recorded.run("verify")
    assert result.code == 1
    assert (
        "error: the record of 1 patch(es) is stale or missing, so they were "
        "proven in full: 0002-fix-the-answer.patch (changed: tests)" in result.err
    )
    assert (
        "hint: run 'xpu-series verify --record' and 'xpu-series verify --mutants "
        "--record', then commit patches/proofs.json" in result.err
    )
    # The hint, followed.
    assert recorded.run("verify", "--record").code == 0
    assert recorded.run("verify", "--mutants", "--record").code == 0
    assert recorded.run("verify").code == 0
    assert recorded.run("verify", "--mutants").code == 0


def test_mutants_stand_on_their_record_until_a_re_proof_disagrees(
    recorded: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = recorded.run("verify", "--mutants", "--record", "--json")
    assert first.code == 0, first.err
    assert "recorded 3 patch(es)" in first.err
    made = {p["name"][:4]: p["made"] for p in json.loads(first.out)["patches"]}
    # No sample: every patch answers from its record, and no mutant runs.
    monkeypatch.setenv("XPU_SERIES_PROOF_SAMPLE", "0")
    again = recorded.run("verify", "--mutants", "--json")
    data = {p["name"][:4]: p for p in json.loads(again.out)["patches"]}
    assert again.code == 0, again.err
    assert {p["source"] for p in data.values()} == {"record"}
    assert {n: p["made"] for n, p in data.items()} == made
    assert f"0001-raise-value.patch: {made['0001']} mutants, from the record" in (
        again.err
    )
    # A record that says a mutant survived, where it is killed: a re-proof of
    # every patch finds it out.
    path = recorded.patches / "proofs.json"
    record = json.loads(path.read_text())
    kept = record["patches"]["0001-raise-value.patch"]["mutants"]["result"]
    kept["survived"] = [{"id": "0123456789", "diff": "x", "operator": "y"}]
    path.write_text(json.dumps(record))
    monkeypatch.setenv("XPU_SERIES_PROVE_ALL", "1")
    checked = recorded.run("verify", "--mutants")
    assert checked.code == 1
    assert (
        "0001-raise-value.patch: the re-proof disagrees with its record: killed "
        "now: 0123456789" in checked.err
    )


def test_a_sampled_re_proof_runs_a_seeded_few_mutants_and_compares_those(
    recorded: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = recorded.run("verify", "--mutants", "--record", "--json")
    assert first.code == 0, first.err
    made = {p["name"]: p["made"] for p in json.loads(first.out)["patches"]}
    big = max(made, key=lambda n: made[n])
    assert made[big] >= 2, made
    # Every unchanged patch is in the sample; each runs one of its mutants.
    monkeypatch.setenv("XPU_SERIES_PROOF_SAMPLE", "3")
    monkeypatch.setenv("XPU_SERIES_PROOF_MUTANTS", "1")
    monkeypatch.setenv("XPU_SERIES_PROOF_SEED", "5")

    def spot() -> tuple[int, dict[str, dict], str]:
        done = recorded.run("verify", "--mutants", "--json")
        patches = {p["name"]: p for p in json.loads(done.out)["patches"]}
        return done.code, patches, done.err

    code, patches, err = spot()
    assert code == 0, err
    ran = patches[big]["spot_checked"]
    assert len(ran) == 1 and patches[big]["made"] == made[big]
    assert patches[big]["killed"] == 1 and patches[big]["ok"]
    assert f"{big}: spot-checking 1 of its {made[big]} mutants (seed 5)" in err
    # A record that says a mutant survived where it is killed: seen when the
    # spot check runs that mutant, not when it runs another.
    path = recorded.patches / "proofs.json"
    record = json.loads(path.read_text())
    kept = record["patches"][big]["mutants"]["result"]
    kept["survived"] = [{"id": "0123456789", "diff": "x", "operator": "y"}]
    path.write_text(json.dumps(record))
    unseen = recorded.run("verify", "--mutants")
    assert unseen.code == 0, unseen.err
    assert f"spot-checked 1/{made[big]}" in unseen.out
    kept["survived"] = [{"id": ran[0], "diff": "x", "operator": "y"}]
    path.write_text(json.dumps(record))
    code, _, err = spot()
    assert code == 1
    assert f"{big}: the re-proof disagrees with its record: killed now: {ran[0]}" in (
        err
    )
    # A run that records runs every mutant (and so replaces the planted record).
    again = recorded.run("verify", "--mutants", "--record", "--json")
    assert again.code == 0, again.err
    rows = {p["name"]: p for p in json.loads(again.out)["patches"]}
    assert rows[big]["spot_checked"] is None and rows[big]["killed"] == made[big]


def test_the_sample_passes_over_a_costly_later_pick_for_verify_and_mutants(
    recorded: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert recorded.run("verify", "--mutants", "--record").code == 0
    path = recorded.patches / "proofs.json"
    record = json.loads(path.read_text())
    names = sorted(record["patches"])
    # Each full proof keeps how long its two runs took.
    for name in names:
        seconds = record["patches"][name]["verify"]["result"]["seconds"]
        assert isinstance(seconds, int) and seconds >= 0, (name, seconds)
    # The first two cost far past the budget, the third fits. The seed is one
    # that draws a costly one first all the same (each does in about one run in
    # 32, see the test below): it is re-proven, the other is passed over for the
    # third. Seconds are no part of a record's key: the record still stands.
    planted = dict(zip(names, (900, 900, 1), strict=True))
    seed = next(
        k for k in range(1, 5000) if sample(k, names, 1, planted, 30) == names[:1]
    )
    ranked = [names[0], names[1], names[2]]
    for name, seconds in planted.items():
        record["patches"][name]["verify"]["result"]["seconds"] = seconds
    path.write_text(json.dumps(record))
    monkeypatch.setenv("XPU_SERIES_PROOF_SAMPLE", "2")
    monkeypatch.setenv("XPU_SERIES_PROOF_SEED", str(seed))
    monkeypatch.setenv("XPU_SERIES_PROOF_MUTANTS", "1")

    def picked() -> tuple[list[str], list[str]]:
        code, sources, err = _sources(recorded)
        assert code == 0, err
        done = recorded.run("verify", "--mutants", "--json")
        assert done.code == 0, done.err
        spotted = [
            p["name"][:4]
            for p in json.loads(done.out)["patches"]
            if p["spot_checked"] is not None
        ]
        return sorted(n for n, s in sources.items() if s == "re-proven"), spotted

    within = sorted(n[:4] for n in (ranked[0], ranked[2]))
    assert picked() == (within, within)
    # No bound (0): the plain sample again.
    monkeypatch.setenv("XPU_SERIES_PROOF_BUDGET", "0")
    plain = sorted(n[:4] for n in sample(seed, names, 2))
    assert picked() == (plain, plain)


def test_a_costly_patch_is_drawn_in_proportion_to_budget_over_cost() -> None:
    names = [f"{k:04d}-patch" for k in range(1, 21)]
    costs = {name: 5.0 for name in names}
    heavy = names[4:7]
    for name in heavy:
        costs[name] = 100.0  # weight 30/100
    seeds = range(1, 3001)
    runs = {seed: sample(seed, names, 2, costs, 30) for seed in seeds}
    with_heavy = [seed for seed, got in runs.items() if set(got) & set(heavy)]
    # The chance is 3 * 0.3 / (17 + 3 * 0.3) = 5.0 %; a plain sample of 2 has
    # one of the three in 28 % of runs.
    assert 0.035 < len(with_heavy) / len(seeds) < 0.065, len(with_heavy)
    plain = [s for s in seeds if set(sample(s, names, 2)) & set(heavy)]
    assert 0.24 < len(plain) / len(seeds) < 0.32, len(plain)
    # Never two at once, and each still comes up.
    assert all(len(set(runs[seed]) & set(heavy)) == 1 for seed in with_heavy)
    assert all(any(name in runs[seed] for seed in with_heavy) for name in heavy)
    # Every run draws its full size; a light patch's chance is the same as before.
    assert all(len(got) == 2 for got in runs.values())
    light = names[0]
    assert abs(
        sum(light in got for got in runs.values())
        - sum(light in sample(s, names, 2) for s in seeds)
    ) < 0.03 * len(seeds)


@pytest.mark.parametrize(
    "name",
    ["XPU_SERIES_PROOF_MUTANTS", "XPU_SERIES_PROOF_SAMPLE", "XPU_SERIES_PROOF_BUDGET"],
)
def test_a_count_that_is_not_a_number_is_named(
    verified: Project, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv(name, "a few")
    done = verified.run("verify", "--mutants")
    assert done.code != 0
    assert f"{name}='a few' is not a whole number" in done.err


def _inputs(project: Project) -> dict[str, dict[str, str]]:
    from xpu_series.project import find_project
    from xpu_series.proofs.record import patch_inputs
    from xpu_series.proofs.series_proof import series_prefixes

    prefixes = series_prefixes(find_project(project.root))
    facts = prefixes.facts()
    return {
        name[:4]: dict(patch_inputs(facts, k).digests)
        for k, name in enumerate(prefixes.names, start=1)
    }


def _edit(path: Path, old: str, new: str) -> None:
    path.write_text(path.read_text().replace(old, new, 1))


# Each kind of input a proof depends on, changed: which patches' keys change,
# and which kind each names.
INPUTS = {
    "the patch": (
        lambda p, mp: _edit(
            p.patches / "0002-fix-the-answer.patch", "Why this change", "Why, then,"
        ),
        {"0002": ["patch"], "0003": ["below"]},
    ),
    "a test file": (
        lambda p, mp: _edit(p.root / "test" / "test_limit.py", "== 20", "== 20.0"),
        {"0003": ["tests"]},
    ),
    "a module the tests import from test/": (
        lambda p, mp: _edit(p.root / "test" / "helpers" / "limits.py", "42", "0x2a"),
        {"0002": ["tests"]},
    ),
    "a conftest.py": (
        lambda p, mp: (p.root / "test" / "conftest.py").write_text("X = 1\n"),
        {"0001": ["tests"], "0002": ["tests"], "0003": ["tests"]},
    ),
    "the pin (and the wheel's sha256)": (
        lambda p, mp: _edit(p.patches / "upstream.toml", "[layout]", "# x\n[layout]"),
        {n: ["pin"] for n in ("0001", "0002", "0003")},
    ),
    "an accepted mutant": (
        lambda p, mp: (p.root / "test" / "accepted_mutants.toml").write_text(
            '[[mutant]]\npatch = "0003-raise-limit.patch"\nid = "abc"\n'
            'reason = "equivalent"\n'
        ),
        {"0003": ["accepted-mutants"]},
    ),
    "the proof code": (
        lambda p, mp: _extra_proof_code(p, mp),
        {n: ["proof-code"] for n in ("0001", "0002", "0003")},
    ),
    "the tool's version": (
        lambda p, mp: mp.setattr("xpu_series.__version__", "9.9.9"),
        {n: ["tool"] for n in ("0001", "0002", "0003")},
    ),
    "a pinned test dependency": (
        lambda p, mp: _edit(p.root / "pyproject.toml", "pytest==9.2.0", "pytest==9"),
        {n: ["environment"] for n in ("0001", "0002", "0003")},
    ),
    "lint settings (no input)": (
        lambda p, mp: _edit(p.root / "pyproject.toml", "= 88", "= 100"),
        {},
    ),
}


def _extra_proof_code(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    from xpu_series.proofs import record

    extra = project.root / "proof_code.py"
    extra.write_text("# one more line of proof code\n")
    real = record.proof_code()
    monkeypatch.setattr(record, "proof_code", lambda: [*real, extra])


@pytest.mark.parametrize("what", list(INPUTS))
def test_changing_any_input_invalidates_the_record(
    tested: Project, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    recorded = tested
    (recorded.root / "pyproject.toml").write_text(
        '[project]\nname = "p"\noptional-dependencies = {test = ["pytest==9.2.0"]}'
        "\n\n[tool.ruff]\nline-length = 88\n"
    )
    before = _inputs(recorded)
    change, expected = INPUTS[what]
    change(recorded, monkeypatch)
    after = _inputs(recorded)
    changed = {
        name: sorted(k for k in after[name] if after[name][k] != before[name][k])
        for name in after
    }
    assert {n: kinds for n, kinds in changed.items() if kinds} == expected


def test_a_proof_whose_inputs_change_while_it_runs_is_not_recorded(
    verified: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The test rewrites a helper its own test file imports: the record would be
    # keyed by content the proof never saw.
    helper = verified.root / "test" / "helpers" / "stamp.py"
    helper.parent.mkdir(parents=True)
    helper.write_text("RUNS = 0\n")
    moving = _write_test(
        verified,
        "test_moving.py",
        "import sys\nfrom pathlib import Path\n\n"
        "HELPER = Path(__file__).parent / 'helpers' / 'stamp.py'\n"
        "sys.path.insert(0, str(HELPER.parent))\n"
        "import stamp  # noqa: E402\n"
        "from sglang.srt.other import answer  # noqa: E402\n\n"
        "def test_answer():\n"
        "    HELPER.write_text(f'RUNS = {stamp.RUNS + 1}\\n')\n"
        "    assert answer() == 42\n",
    )
    verified.add_patch(
        "python/sglang/srt/other.py",
        "def answer():\n    return 42\n",
        "[XPU] Fix the answer",
        Tests=moving,
    )
    monkeypatch.delenv("CI", raising=False)
    result = verified.run("verify", "--record")
    assert result.code == 0, result.err
    assert "recorded 1 patch(es) in patches/proofs.json: 0001" in result.err
    assert (
        "note: not recorded, their inputs changed while the run went on: "
        "0002-fix-the-answer.patch" in result.err
    )
    assert "hint: run 'xpu-series verify --record' again" in result.err
    record = json.loads((verified.patches / "proofs.json").read_text())
    assert list(record["patches"]) == ["0001-raise-value.patch"]


def test_a_mutant_stopped_by_its_time_limit_is_left_out_of_the_comparison() -> None:
    from xpu_series.proofs.mutants import Mutant, PatchMutants

    made = [Mutant("a.py", "op", 1, "x = 1", f"x = {n}", f"x = {n}\n") for n in (2, 3)]
    first, second = (m.id for m in made)
    row = {"id": first, "diff": "a.py:1: -x = 1 +x = 2", "operator": "op"}
    recorded = {"made": 2, "survived": [row], "timed_out": []}

    def now(outcomes: dict[str, str]) -> str:
        return PatchMutants("p", ("t",), made, outcomes, {}).disagreement(recorded)

    assert now({first: "survived", second: "killed"}) == ""
    # A kill where the record has a survivor, and the other way round.
    assert now({first: "killed", second: "killed"}) == f"killed now: {first}"
    assert now({first: "survived", second: "survived"}) == f"survived now: {second}"
    # Stopped by its time limit now (a kill that a loaded machine can make).
    assert now({first: "timeout", second: "killed"}) == ""
    # ... or when the record was made.
    recorded["timed_out"] = [second]
    assert now({first: "survived", second: "survived"}) == ""
    assert now({first: "survived"}) == ""
    recorded["made"] = 3
    assert (
        now({first: "survived", second: "killed"}) == "3 mutants recorded, 2 made now"
    )


def test_a_patch_added_on_top_while_the_run_goes_on_keeps_the_proofs_below(
    verified: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The test adds a patch on top of the series as it runs (someone refreshing
    # a new patch meanwhile): nothing the proofs below read has changed.
    series = verified.patches / "series"
    first = verified.patches / "0001-raise-value.patch"
    _write_test(
        verified,
        "test_value.py",
        "from pathlib import Path\nfrom sglang.srt.flags import VALUE\n\n"
        "def test_value():\n"
        "    assert VALUE == 2\n"
        # Only the run with the patch: the two runs go side by side.
        f"    new = Path({str(verified.patches)!r}) / '0002-on-top.patch'\n"
        f"    new.write_text(Path({str(first)!r}).read_text())\n"
        f"    series = Path({str(series)!r})\n"
        "    series.write_text(series.read_text() + '0002-on-top.patch\\n')\n",
    )
    monkeypatch.delenv("CI", raising=False)
    result = verified.run("verify", "--record")
    assert result.code == 0, result.err
    assert "recorded 1 patch(es) in patches/proofs.json: 0001" in result.err
    assert "not recorded" not in result.err


def test_the_matrix_reads_the_pins_cells_from_verifys_record(
    recorded: Project,
) -> None:
    result = recorded.run("matrix", "0.0.1", "--behaviour", "--json")
    assert result.code == 0, result.err
    assert "0 test runs to make (3 patches from verify's record)" in result.err
    rows = {p["name"][:4]: p for p in json.loads(result.out)["patches"]}
    assert {n: r["behaviour"]["0.0.1"] for n, r in rows.items()} == {
        "0001": "needed", "0002": "needed", "0003": "needed",
    }  # fmt: skip
    assert rows["0003"]["detail"]["0.0.1"] == (
        "without: 0 passed, 1 failed; with: 1 passed, 0 failed (verify's record)"
    )
    # A stale record is no measurement: that patch's tests run again.
    _edit(recorded.root / "test" / "test_limit.py", "== 20", "in (20, 21)")
    again = recorded.run("matrix", "0.0.1", "--behaviour", "--json")
    assert "2 test runs to make (2 patches from verify's record)" in again.err
    rows = {p["name"][:4]: p for p in json.loads(again.out)["patches"]}
    assert rows["0003"]["behaviour"]["0.0.1"] == "needed"
    assert "record" not in rows["0003"]["detail"]["0.0.1"]


def test_a_retired_patchs_cell_on_the_pin_is_kept_in_the_matrix_record(
    recorded: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conftest import BASE_FILES, build_wheel, wheel_name

    # 0.0.2 has 0001's change: the rebase retires it, and on the new pin verify
    # proves 0002 and 0003 only.
    files = {**BASE_FILES, "sglang/srt/flags.py": "VALUE = 2\nNAME = 'upstream'\n"}
    wheel = tmp_path / wheel_name("0.0.2")
    build_wheel(wheel, files, version="0.0.2")
    moved = recorded.run("rebase", "--onto", "0.0.2", "--wheel", str(wheel))
    assert moved.code == 0, moved.err
    assert (recorded.patches / "upstreamed" / "0001-raise-value.patch").is_file()
    assert recorded.run("verify", "--record").code == 0
    args = ("matrix", "0.0.2", "--behaviour", "--json")
    written = recorded.run(*args, "--record")
    assert written.code == 0, written.err
    cells = json.loads((recorded.patches / "matrix-record.json").read_text())
    assert sorted(cells["releases"]["0.0.2"]) == ["0001-raise-value.patch"]
    # Next run: every cell of the pin from a record, none measured.
    monkeypatch.setenv("XPU_SERIES_PROOF_SAMPLE", "0")
    again = recorded.run(*args)
    assert again.code == 0, again.err
    assert (
        "matrix 0.0.2: 0 test runs to make (2 patches from verify's record, "
        "1 patches from the matrix record)" in again.err
    )
    rows = {p["name"][:4]: p for p in json.loads(again.out)["patches"]}
    assert rows["0001"]["detail"]["0.0.2"].endswith("(matrix record)")
    assert rows["0002"]["detail"]["0.0.2"].endswith("(verify's record)")
    assert (
        rows["0001"]["behaviour"] == json.loads(written.out)["patches"][0]["behaviour"]
    )


def test_a_matrix_cell_is_keyed_by_its_release_and_status_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xpu_series.matrix.record import cell_inputs
    from xpu_series.proofs import record

    patch = tmp_path / "0001-a.patch"
    patch.write_text("a patch\n")
    (tmp_path / "upstream.toml").write_text("[upstream]\n")
    facts = record.SeriesFacts(
        root=tmp_path, names=[patch.name], files=[patch], tests=[()],
        trees=["t0", "t1"], accepted={}, pin=tmp_path / "upstream.toml",
    )  # fmt: skip
    base = cell_inputs(facts, 1, "0.5.20", "applied")
    proof = record.patch_inputs(facts, 1).digests
    assert {k: base.digests[k] for k in proof} == dict(proof)
    assert base.changed(cell_inputs(facts, 1, "0.5.21", "applied").digests) == [
        "release"
    ]
    assert base.changed(cell_inputs(facts, 1, "0.5.20", "conflict").digests) == [
        "status"
    ]
    # The matrix's own code keys a cell too (the code that counts it).
    from xpu_series.matrix import record as matrix_record

    extra = tmp_path / "matrix_code.py"
    extra.write_text("# one more line of matrix code\n")
    real = matrix_record.matrix_code()
    monkeypatch.setattr(matrix_record, "matrix_code", lambda: [*real, extra])
    assert base.changed(cell_inputs(facts, 1, "0.5.20", "applied").digests) == [
        "matrix-code"
    ]
