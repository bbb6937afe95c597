"""The operation runner behind `apply` and `rebase`: patches carried one at a time
onto a base, the state saved after every step, so a conflict or an interrupt stops
the operation and never the user's work (stgit's transaction, git's rebase-apply)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from xpu_series.errors import Interrupted, UsageError, XpuSeriesError
from xpu_series.git import Git
from xpu_series.lock import tree_lock
from xpu_series.project import Project
from xpu_series.result import (
    PatchOutcome,
    PatchStatus,
    Report,
    UpstreamInfo,
)
from xpu_series.stack import engine
from xpu_series.stack.engine import (
    ProgressHook,
    _abort_am,
    classify_patch,
    stop_with_markers,
)
from xpu_series.stack.handwork import EDIT_STOP, HandSteps
from xpu_series.stack.hunks import preimages
from xpu_series.stack.operation import (
    ORIG_HEAD_REF,
    ORIG_UPSTREAM_REF,
    Operation,
    article,
)
from xpu_series.stack.series import Patch, Series, load_series_for
from xpu_series.stack.tree import (
    APPLIED_REF,
    UPSTREAM_TAG,
    borrow_blobs,
    checkout_base,
    ensure_base_cache,
    materialize_base,
    read_record,
    repair,
    write_record,
)
from xpu_series.stack.wheel import fetch_wheel

FinishHook = Callable[["Runner"], None]
# Hand resolutions a rebase recorded, replayed when the same patch text meets the
# same tree again (git's rerere, at the grain of a whole patch).
RESOLUTIONS = "resolutions"


def _decided_status(decision: dict) -> PatchStatus:
    """How a patch the plan retires (upstream has it) or drops is reported."""
    return PatchStatus.ABSORBED if decision["action"] == "retire" else (
        PatchStatus.SKIPPED)  # fmt: skip


def resolution_path(patch: Patch, version: str, tree_id: str) -> Path:
    """Where the resolution of `patch` on the tree `tree_id` is kept, relative to
    patches/: content-addressed by the patch text and the tree it met."""
    digest = hashlib.sha256(patch.text.encode("utf-8")).hexdigest()
    stem = patch.name.removesuffix(".patch")
    return Path(RESOLUTIONS) / stem / f"{version}-{digest[:12]}-{tree_id[:12]}.patch"


@dataclass
class Outcome:
    """Where an operation run ended: finished, or stopped for a human."""

    op: Operation
    report: Report
    finished: bool
    stopped_files: list[str] = field(default_factory=list)


def _outcome_json(done: dict) -> PatchOutcome:
    return PatchOutcome(
        name=done["name"],
        status=PatchStatus(done["status"])
        if done["status"] in PatchStatus.__members__.values()
        else PatchStatus.SKIPPED,
        concern=done.get("concern", ""),
        files=tuple(done.get("files", ())),
        detail=done.get("detail", ""),
        commit=done.get("commit", ""),
    )


def borrow_pin_objects(project: Project, git: Git) -> list[str]:
    """Make the pinned base's blobs that the patches apply to available so
    `git am -3` can merge patches made against it onto another upstream. Best
    effort: only from the cache."""
    pin = project.pin
    try:
        wheel = fetch_wheel(pin, project.cache_dir, offline=True)
    except XpuSeriesError:  # it only costs the 3-way fallback
        wheel = None
    if wheel is None:
        return ["the pinned wheel is not cached: no 3-way merge fallback"]
    cache_repo, _built = ensure_base_cache(wheel, pin, project.cache_dir)
    # Every patch file under patches/ (retired ones too: an older release may
    # still carry them); a blob the base lacks is one a lower patch made.
    wanted = {
        blob
        for path in sorted(project.patches_dir.rglob("*.patch"))
        for blob in preimages(path.read_text(errors="replace"))
    }
    borrow_blobs(git, cache_repo, wanted)
    return []


class Runner(HandSteps):
    """One apply or rebase, from its state on disk (what a human does at a stop is
    in HandSteps)."""

    def __init__(
        self,
        project: Project,
        op: Operation,
        on_patch: ProgressHook | None = None,
        progress: bool = False,
    ) -> None:
        self.project = project
        self.store = project.operations
        self.op = op
        self.git = Git(Path(op.tree))
        self.on_patch = on_patch
        self.progress = progress
        self.notes: list[str] = []
        self.upstream: UpstreamInfo | None = None

    # -- state ---------------------------------------------------------------

    def save(self, phase: str | None = None) -> None:
        if phase:
            self.op.phase = phase
        self.store.save(self.op)

    def series(self) -> Series:
        """The patches as they were when the operation began (its own copy)."""
        version = self.op.target.get("version")
        return load_series_for(
            self.store.patches_backup, version, self.project.pin.version
        )

    def patch(self, name: str) -> Patch:
        return next(p for p in self.series().patches if p.name == name)

    # -- steps ---------------------------------------------------------------

    def begin(self) -> None:
        """Record the tree as it is, so --abort can put it back byte for byte."""
        git = self.git
        existed = git.is_repo()
        orig = {"existed": existed, "head": "", "branch": "", "upstream": ""}
        if existed:
            orig["head"] = git.rev("HEAD") or ""
            branch = git.run("symbolic-ref", "-q", "--short", "HEAD", check=False)
            orig["branch"] = branch.stdout.strip()
            orig["upstream"] = git.rev(UPSTREAM_TAG) or ""
            orig["applied_ref"] = git.rev(APPLIED_REF) or ""
            for ref, sha in ((ORIG_HEAD_REF, orig["head"]),
                             (ORIG_UPSTREAM_REF, orig["upstream"])):  # fmt: skip
                if sha:
                    git.run("update-ref", ref, sha)
        self.op.orig = orig
        self.store.begin(self.op, git if existed else None)

    def prepare(self) -> None:
        """Fetch the target and put the tree at its base (phases fetch, base)."""
        op, project = self.op, self.project
        tree = Path(op.tree)
        if op.target.get("checkout"):
            self.save("base")
            base = checkout_base(tree)
            self.upstream = UpstreamInfo(base.version, "", pinned=False,
                                         source="checkout")  # fmt: skip
        else:
            self.save("fetch")
            version = op.target["version"]
            pin = project.pin.for_version(version)
            local = op.target.get("local")
            try:
                wheel = fetch_wheel(
                    pin,
                    project.cache_dir,
                    local=Path(local) if local else None,
                    progress=self.progress,
                    sha256=op.target.get("sha256") or None,
                )
            except XpuSeriesError:
                # Nothing has changed yet: a missing release or a bad wheel
                # ends the operation instead of leaving one to abort.
                self.abort()
                self.store.end()
                raise
            op.target.update(sha256=wheel.sha256, wheel=wheel.path.name)
            self.save("base")
            base = materialize_base(wheel, pin, tree, project.cache_dir)
            self.upstream = UpstreamInfo(wheel.version, wheel.sha256,
                                         pinned=pin.pinned)  # fmt: skip
            if not pin.pinned:
                self.notes.append(
                    f"{pin.wheel} is not the pin; its sha256 {wheel.sha256} was "
                    "recorded, not checked"
                )
            if version != project.pin.version:
                self.notes += borrow_pin_objects(project, self.git)
        self.notes.append(f"base from {base.source} ({base.commit[:12]})")
        op.last_good = base.commit
        op.todo = [p.name for p in self.series().patches]
        op.done = []
        self.save("patches")

    def upstream_info(self) -> UpstreamInfo:
        if self.upstream is None:
            t = self.op.target
            self.upstream = UpstreamInfo(
                t.get("version", ""), t.get("sha256", ""),
                pinned=t.get("sha256") == self.project.pin.sha256,
            )  # fmt: skip
        return self.upstream

    def carry(self) -> Outcome:
        """Commit what is left to do; stop at the first patch that needs a human."""
        op, git = self.op, self.git
        version = op.target.get("version")
        exact = version == self.project.pin.version
        total = len(op.done) + len(op.todo)
        try:
            while op.todo:
                patch = self.patch(op.todo[0])
                if self.on_patch:
                    self.on_patch(patch, len(op.done), total)
                decision = self.decision(patch.name)
                editing = bool(decision) and decision["action"] == "edit"
                if decision and not editing:
                    op.done.append(self._decided(patch, decision))
                    op.todo.pop(0)
                    self.save()
                    continue
                replayed = self.replay_resolution(patch) if editing else ""
                if replayed:
                    status, detail = PatchStatus.MERGED, replayed
                else:
                    status, detail = engine.commit_patch(git, patch, exact=exact)
                    status, detail = engine.settle(git, patch, status, detail, version)
                if (
                    editing
                    and not replayed
                    and status in (PatchStatus.APPLIED, PatchStatus.MERGED)
                ):
                    return self._stop_for_edit(patch, status)
                if not status.ok:
                    replayed = self.replay_resolution(patch)
                    if replayed:
                        status, detail = PatchStatus.MERGED, replayed
                    else:
                        return self._stop(patch, status, detail)
                commit = ""
                if status in (PatchStatus.APPLIED, PatchStatus.MERGED):
                    commit = git.out("rev-parse", "HEAD")
                    op.last_good = commit
                op.done.append(self._done(patch, status, detail, commit))
                op.todo.pop(0)
                self.save()
        except KeyboardInterrupt:
            _abort_am(git)
            git.run("reset", "-q", "--hard", op.last_good, check=False)
            self.save()
            raise self.interrupted() from None
        return Outcome(op, self.report(), finished=True)

    def decision(self, name: str) -> dict | None:
        return next((d for d in self.op.plan if d["name"] == name), None)

    def _decided(self, patch: Patch, decision: dict) -> dict:
        """A patch the plan retires or drops: not applied, recorded why."""
        retire = decision["action"] == "retire"
        since = f" from {decision['since']}" if retire else ""
        done = self._done(
            patch,
            _decided_status(decision),
            f"{decision['action']}d by the plan{since}: {decision['reason']}",
            "",
        )
        done.update(
            reason=decision["reason"], upstreamed=retire, since=decision["since"]
        )
        return done

    def replay_resolution(self, patch: Patch) -> str:
        """Commit the recorded hand resolution of `patch` on this tree, if any."""
        op, git = self.op, self.git
        tree_id = git.out("rev-parse", "HEAD^{tree}")
        rel = resolution_path(patch, op.target.get("version", ""), tree_id)
        record = self.store.patches_backup / rel
        if not record.is_file():
            return ""
        result = git.run(*engine._AM, str(record), check=False)
        if not result.ok:
            _abort_am(git)
            git.run("reset", "-q", "--hard", op.last_good)
            self.notes.append(f"the recorded resolution patches/{rel} does not apply")
            return ""
        return f"resolved as recorded in patches/{rel}"

    def _done(
        self, patch: Patch, status: PatchStatus, detail: str, commit: str
    ) -> dict:
        return {
            "name": patch.name,
            "status": str(status),
            "detail": detail,
            "commit": commit,
            "concern": patch.concern,
            "files": list(patch.files),
        }

    def _stop_for_edit(self, patch: Patch, status: PatchStatus) -> Outcome:
        """The plan's `edit`: the patch is committed; stop so it can be amended."""
        self.op.current = patch.name
        self.op.current_detail = f"{status}: {EDIT_STOP}"
        self.op.carried = self.git.out("rev-parse", "HEAD")  # to tell an edit
        self.save("stopped")
        return Outcome(self.op, self.report(), finished=False)

    def _stop(self, patch: Patch, status: PatchStatus, detail: str) -> Outcome:
        """Report the rest (classified on the last good state), then leave the
        failed patch in progress with conflict markers for the human."""
        rest: list[PatchOutcome] = []
        failed_files = set(patch.files)
        for name in self.op.todo[1:]:
            other = self.patch(name)
            base = dict(name=name, concern=other.concern, files=other.files)
            decision = self.decision(name)
            if decision and decision["action"] != "edit":
                will = f"the plan will {decision['action']} it"
                rest.append(PatchOutcome(**base, status=_decided_status(decision),
                                         detail=will))  # fmt: skip
                continue
            if failed_files.intersection(other.files):
                rest.append(PatchOutcome(**base, status=PatchStatus.SKIPPED,
                            detail=f"touches a file of {patch.name}"))  # fmt: skip
                continue
            seen = classify_patch(self.git, other, self.op.target.get("version"))
            rest.append(PatchOutcome(**base, status=seen,
                        detail=f"checked only: stopped at {patch.name}"))  # fmt: skip
        files = stop_with_markers(self.git, patch)
        self.op.current = patch.name
        self.op.current_detail = f"{status}: {detail}"
        self.save("stopped")
        report = self.report(rest)
        return Outcome(self.op, report, finished=False, stopped_files=files)

    def report(self, rest: list[PatchOutcome] | None = None) -> Report:
        op = self.op
        outcomes = [_outcome_json(d) for d in op.done]
        if op.stopped:
            current = self.patch(op.current)
            status, _, detail = op.current_detail.partition(": ")
            outcomes.append(
                PatchOutcome(
                    current.name,
                    PatchStatus(status),
                    current.concern,
                    current.files,
                    detail,
                )  # fmt: skip
            )
            if rest is None:
                rest = [
                    PatchOutcome(n, PatchStatus.SKIPPED, detail="not tried yet")
                    for n in op.todo[1:]
                ]
            outcomes += rest
        return Report(
            self.upstream_info(),
            outcomes,
            notes=list(self.notes),
            tree=op.tree,
            head=self.git.rev("HEAD") or "",
        )

    def interrupted(self) -> Interrupted:
        kind = self.op.kind
        again = (
            " (a plain 'xpu-series apply' rebuilds it too)" if kind == "apply" else ""
        )
        return Interrupted(
            f"interrupted: the {kind} stopped during {self.op.phase}; "
            f"its state is in {self.store.dir}",
            hint=f"run 'xpu-series {kind} --continue' to finish it{again}, or "
            f"'xpu-series {kind} --abort' to undo it",
        )


def open_operation(project: Project, kind: str) -> Operation:
    """The operation `--continue`, `--skip` or `--abort` of `kind` works on."""
    op = project.operations.load()
    if op is None:
        raise UsageError(
            f"no {kind} is in progress",
            hint=f"start one with 'xpu-series {kind}'"
            + (" --onto VERSION" if kind == "rebase" else ""),
        )
    if op.kind != kind:
        raise UsageError(
            f"the operation in progress is {op.described()}, not {article(kind)}",
            hint=f"use 'xpu-series {op.kind} --continue' or "
            f"'xpu-series {op.kind} --abort'",
        )
    return op


def abort_operation(project: Project, kind: str) -> tuple[Operation, list[str]]:
    op = open_operation(project, kind)
    runner = Runner(project, op)
    with tree_lock(Path(op.tree), f"xpu-series {kind} --abort"):
        notes = runner.abort()
        project.operations.end()
    return op, notes


def resume(runner: Runner, finish: FinishHook) -> Outcome:
    """Go on from the saved state: redo an interrupted step, carry the rest."""
    op = runner.op
    try:
        if op.phase in ("start", "fetch", "base"):
            if op.orig.get("existed") and runner.git.is_repo():
                repair(runner.git)
            runner.prepare()
        elif op.phase == "stopped":
            runner.resolve_current()
        elif op.phase == "patches":
            runner.reset_to_last_good()
        if op.phase != "write":
            outcome = runner.carry()
            if not outcome.finished:
                return outcome
        finish(runner)
    except KeyboardInterrupt:
        runner.save()
        raise runner.interrupted() from None
    runner.store.end()
    return Outcome(op, runner.report(), finished=True)


def record_applied(runner: Runner, series_digest: str) -> None:
    """The tree's bookkeeping after a finished operation."""
    git = runner.git
    record = read_record(git)
    record["applied"] = [
        {"name": d["name"], "status": d["status"], "commit": d.get("commit", "")}
        for d in runner.op.done
    ]
    record["series"] = series_digest
    write_record(git, record)
    git.run("update-ref", APPLIED_REF, "HEAD")
    for ref in (ORIG_HEAD_REF, ORIG_UPSTREAM_REF):
        git.run("update-ref", "-d", ref, check=False)
