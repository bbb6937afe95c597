"""audit's report and inputs: summary first, per-kind counts, the triage file's
kinds, the kernel surface, the ledger of upstream reports, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import Project

from xpu_series.audit.ledger import check_ledger, load_ledger
from xpu_series.audit.surface import load_surface
from xpu_series.audit.triage import load_triage
from xpu_series.errors import UsageError

SCHEDULER = """\
import torch
import torch.distributed as dist

class Scheduler:
    def continue_generation(self):
        torch.cuda.empty_cache()

    def sync(self):
        torch.cuda.synchronize()

    def sync_ids(self, token_ids):
        dist.all_reduce(token_ids, op=dist.ReduceOp.MIN, group=self.tp_group)
"""
LEDGER = """\
[[report]]
url = "https://github.com/sgl-project/sglang/issues/31011"
kind = "collective-op"
file = "python/sglang/srt/managers/scheduler.py"
function = "Scheduler.sync_ids"
api = "all_reduce:ReduceOp.MIN"
[report.releases]
"0.0.1" = "present"

[[report]]
url = "https://github.com/sgl-project/sglang/pull/1"
kind = "other"
file = "python/sglang/srt/gone.py"
function = "*"
api = "anything"
[report.releases]
"0.0.1" = "fixed-upstream:0.0.1"

[[report]]
url = "https://github.com/sgl-project/sglang/pull/2"
kind = "torch-cuda"
file = "python/sglang/srt/managers/scheduler.py"
function = "Scheduler.renamed"
api = "torch.cuda.synchronize"
[report.releases]
"0.0.1" = "present"
"""


def tree_with(project: Project, files: dict[str, str]) -> Path:
    tree = project.root / "t"
    for rel, text in files.items():
        path = tree / "python/sglang" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (tree / "python/sglang/__init__.py").touch()
    return tree


# --- the report ------------------------------------------------------------------


def test_the_summary_comes_first_and_only_what_needs_a_person_follows(
    project: Project,
) -> None:
    tree = tree_with(project, {"srt/managers/scheduler.py": SCHEDULER})
    (project.patches / "audit.toml").write_text(
        '[[accept]]\nfile = "python/sglang/srt/managers/scheduler.py"\n'
        'function = "Scheduler.sync"\nreason = "only after a CUDA graph replay"\n'
    )
    text = project.run("audit", "--tree", str(tree)).out.splitlines()
    assert text[0].startswith("audited: ")
    listed = "\n".join(text)
    # Exposed findings of every kind are listed; the triaged one is not, nor the
    # triage coverage.
    assert "all_reduce:ReduceOp.MIN [collective-op, wrong-result] exposed" in listed
    assert "torch.cuda.empty_cache" in listed
    assert "Scheduler: sync\n" not in listed + "\n"
    assert "only after a CUDA graph replay" not in listed
    assert listed.index("by kind:") < listed.index("torch.cuda.empty_cache")
    assert "  collective-op: exposed 1" in listed
    everything = project.run("audit", "--tree", str(tree), "--all").out
    assert "only after a CUDA graph replay" in everything
    assert everything == project.run("audit", "--tree", str(tree), "--verbose").out


def test_json_counts_each_kind_and_names_the_kernel_surface(project: Project) -> None:
    tree = tree_with(project, {"srt/managers/scheduler.py": SCHEDULER})
    data = json.loads(project.run("audit", "--tree", str(tree), "--json").out)
    by_kind = data["counts"]["kind"]
    assert by_kind["collective-op"] == {"exposed": 1}
    assert by_kind["torch-cuda"] == {"exposed": 2}
    assert by_kind["ipc"] == {}  # every kind is listed, found or not
    assert data["surface"]["commit"] == "9cf16bf9f37928c2786195c7e10ff92d9051dfaf"
    (finding,) = [f for f in data["findings"] if f["kind"] == "collective-op"]
    assert finding["effect"] == "wrong-result"
    assert "oneCCL" in finding["what"] and finding["replacement"]
    assert finding["fingerprint"]


# --- the triage file's kinds ------------------------------------------------------


def test_a_triage_entry_accepts_only_the_kind_it_names(
    project: Project, tmp_path: Path
) -> None:
    tree = tree_with(project, {"srt/managers/scheduler.py": SCHEDULER})
    # Written for the CUDA calls of the file: it does not accept the reduction.
    (project.patches / "audit.toml").write_text(
        '[[accept]]\nfile = "python/sglang/srt/managers/scheduler.py"\n'
        'reason = "the CUDA calls run after a CUDA-only branch"\n'
    )
    data = json.loads(project.run("audit", "--tree", str(tree), "--json").out)
    verdicts = {f["kind"]: f["verdict"] for f in data["findings"]}
    assert verdicts == {"torch-cuda": "triaged", "collective-op": "exposed"}
    (project.patches / "audit.toml").write_text(
        '[[accept]]\nfile = "python/sglang/srt/managers/scheduler.py"\n'
        'kind = "collective-op"\nreason = "a gloo group in this test"\n'
    )
    data = json.loads(project.run("audit", "--tree", str(tree), "--json").out)
    verdicts = {f["kind"]: f["verdict"] for f in data["findings"]}
    assert verdicts == {"torch-cuda": "exposed", "collective-op": "triaged"}


def test_an_unknown_kind_in_the_triage_file_is_a_clear_error(
    project: Project, tmp_path: Path
) -> None:
    path = tmp_path / "audit.toml"
    path.write_text(
        '[[accept]]\nfile = "x"\nreason = "r"\n\n'
        '[[accept]]\nfile = "y"\nkind = "collective-ops"\nreason = "r"\n'
    )
    with pytest.raises(UsageError) as caught:
        load_triage(path)
    assert f"{path}:5: unknown kind 'collective-ops'" in caught.value.message
    assert "collective-op" in caught.value.hint
    tree = tree_with(project, {"srt/managers/scheduler.py": SCHEDULER})
    result = project.run("audit", "--tree", str(tree), "--triage", str(path))
    assert result.code == 2
    assert "unknown kind 'collective-ops'" in result.err


# --- the kernel surface -------------------------------------------------------------


@pytest.mark.parametrize(
    "text, words",
    [
        (None, "does not exist"),
        ("{not json", "not valid JSON"),
        ('{"refs": {}}', "no 'refs' table"),
        ('{"refs": {"main": {"commit": "abc", "modules": []}}}', "has no 'date'"),
        (
            '{"refs": {"main": {"commit": "a", "date": "d", "modules": [1], '
            '"exported": []}}}',
            "'modules' must be a list of names",
        ),
    ],
)
def test_a_missing_or_malformed_surface_is_a_clear_error(
    project: Project, tmp_path: Path, text: str | None, words: str
) -> None:
    path = tmp_path / "surface.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(UsageError) as caught:
        load_surface(path)
    assert words in caught.value.message and str(path) in caught.value.message
    tree = tree_with(project, {"srt/managers/scheduler.py": SCHEDULER})
    result = project.run("audit", "--tree", str(tree), "--surface", str(path))
    assert result.code == 2 and words in result.err


def test_the_newest_ref_of_the_surface_is_the_one_used() -> None:
    surface = load_surface()
    assert (surface.ref, surface.short) == ("main", "9cf16bf")
    assert surface.provides("sgl_kernel.flash_attn")  # a module
    assert surface.provides("sgl_kernel.merge_state_v2")  # an exported name
    assert not surface.provides("sgl_kernel.flash_mla_decode_get_workspace_size")


# --- the ledger -----------------------------------------------------------------


def test_the_ledger_is_rechecked_on_the_audited_tree(project: Project) -> None:
    tree = tree_with(project, {"srt/managers/scheduler.py": SCHEDULER})
    (project.patches / "xpu-reports.toml").write_text(LEDGER)
    result = project.run("audit", "--tree", str(tree), "--json")
    ledger = json.loads(result.out)["ledger"]
    assert ledger["reports"] == 3 and ledger["release"] == "0.0.1"
    assert ledger["status"] == {"present": 2, "fixed-upstream": 1}
    stale = {s["url"].rsplit("/", 1)[-1]: s["why"] for s in ledger["stale"]}
    assert stale == {
        "1": "no file matches",
        "2": "Scheduler.renamed is not defined there",
    }
    assert ledger["unseen"] == []
    text = project.run("audit", "--tree", str(tree)).out
    assert "stale 2" in text
    assert "stale: xpu-reports.toml:" in text and "Scheduler.renamed" in text


def test_a_present_report_no_rule_finds_is_unseen(tmp_path: Path) -> None:
    path = tmp_path / "xpu-reports.toml"
    path.write_text(LEDGER)
    reports = load_ledger(path)
    texts = {
        "python/sglang/srt/managers/scheduler.py": SCHEDULER.replace(
            "def sync(self)", "def renamed(self)"
        )
    }
    check = check_ledger(reports, "xpu-reports.toml", "0.0.1", texts, [])
    assert [r.url for r, _ in check.stale] == [
        "https://github.com/sgl-project/sglang/pull/1"
    ]
    assert [r.api for r in check.unseen] == [
        "all_reduce:ReduceOp.MIN",
        "torch.cuda.synchronize",
    ]
    assert check_ledger(reports, "x", "0.0.9", texts, []).unlisted == reports


@pytest.mark.parametrize(
    "edit, line, words",
    [
        (('url = "https://github.com/sgl-project/sglang/pull/2"', 'url = ""'), 19,
         "needs a non-empty 'url'"),
        (('"0.0.1" = "fixed-upstream:0.0.1"', '"0.0.1" = "gone"'), 10,
         "status 'gone' is not present"),
        (('kind = "other"', 'kind = "bug"'), 10, "unknown kind 'bug'"),
        (('api = "anything"', 'api = "anything"\nline = 3'), 10, "unknown key 'line'"),
        (('"0.0.1" = "present"\n', '"0.0.1" = "present\n'), 0, "not valid TOML"),
    ],
)  # fmt: skip
def test_a_malformed_ledger_names_the_line(
    project: Project, tmp_path: Path, edit: tuple[str, str], line: int, words: str
) -> None:
    path = tmp_path / "xpu-reports.toml"
    path.write_text(LEDGER.replace(*edit, 1))
    with pytest.raises(UsageError) as caught:
        load_ledger(path)
    assert words in caught.value.message
    if line:
        assert f"{path}:{line}:" in caught.value.message
    tree = tree_with(project, {"srt/managers/scheduler.py": SCHEDULER})
    result = project.run("audit", "--tree", str(tree), "--ledger", str(path))
    assert result.code == 2 and words in result.err


def test_an_unparsable_file_is_reported_and_the_rest_audited(project: Project) -> None:
    tree = tree_with(
        project,
        {"srt/managers/scheduler.py": SCHEDULER, "srt/broken.py": "def broken(:\n"},
    )
    data = json.loads(project.run("audit", "--tree", str(tree), "--json").out)
    assert [e["file"] for e in data["parse_errors"]] == ["python/sglang/srt/broken.py"]
    assert {f["kind"] for f in data["findings"]} == {"torch-cuda", "collective-op"}
    text = project.run("audit", "--tree", str(tree)).out
    assert "warning: python/sglang/srt/broken.py does not parse (line 1" in text


def test_what_the_series_adds_is_listed_even_when_a_broad_entry_triages_it(
    project: Project,
) -> None:
    # The tree with the series (build/sglang, its `upstream` tag the release as
    # shipped) gains a scheduler whose reduction a broad entry accepts.
    scheduler = project.tree / "python/sglang/srt/managers/scheduler.py"
    scheduler.parent.mkdir(parents=True, exist_ok=True)
    scheduler.write_text(SCHEDULER)
    (project.patches / "audit.toml").write_text(
        '[[accept]]\nfile = "python/sglang/srt/managers/*"\nkind = "collective-op"\n'
        'reason = "a broad entry written for something else"\n'
    )
    result = project.run("audit")
    assert "all_reduce:ReduceOp.MIN [collective-op, wrong-result] triaged" in (
        result.out
    )
    # The two CUDA calls are new too (and exposed).
    assert "new with the series (not in the release as shipped): 3" in result.out
    data = json.loads(project.run("audit", "--json").out)
    added = set(data["new_with_series"])
    kinds = sorted(f["kind"] for f in data["findings"] if f["fingerprint"] in added)
    assert kinds == ["collective-op", "torch-cuda", "torch-cuda"]
