"""Build the fork wheel: the hash-checked release wheel with the series applied, the
series' local version, its identity and a plugin entry point, byte-reproducible."""

from __future__ import annotations

import csv
import hashlib
import io
import os
import re
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from xpu_series.errors import (
    IntegrityError,
    SeriesError,
    TreeError,
    UsageError,
    WheelError,
)
from xpu_series.fork.archive import Member, copied, stored, write_zip
from xpu_series.fork.identity import (
    ENTRY_POINTS,
    PLUGIN_MODULE,
    PLUGIN_PACKAGE,
    RECORD_NAME,
    describe_series,
    plugin_source,
    record_bytes,
    with_plugin,
)
from xpu_series.git import Git, read_blobs, run_command
from xpu_series.overlay.installed import record_hash
from xpu_series.project import Project
from xpu_series.stack.build import ScratchRequest, build_scratch
from xpu_series.stack.engine import ProgressHook
from xpu_series.stack.hunks import blob_id
from xpu_series.stack.pin import Pin
from xpu_series.stack.tree import read_record
from xpu_series.stack.wheel import FetchedWheel, check_wheel, fetch_wheel

# Every entry's date when SOURCE_DATE_EPOCH is not set: 1980-01-01, the first a
# zip can hold.
DEFAULT_EPOCH = 315532800
_TAG = re.compile(r"^cp3[0-9]{1,2}$")
_NO_BLOB = "0" * 40


@dataclass(frozen=True)
class WheelRequest:
    """Which fork wheel to build, and where it goes."""

    out: Path
    version: str | None = None  # default: the pin
    tag: str | None = None  # a CPython tag (cp312); default: the pin's
    local: Path | None = None  # the release wheel as a local file
    revision: str | None = None  # default: git HEAD of the project
    force: bool = False
    progress: bool = False


@dataclass(frozen=True)
class Change:
    """One file the series changes: its wheel member, blobs before and after."""

    member: str
    old_blob: str
    new_blob: str
    executable: bool

    @property
    def deleted(self) -> bool:
        return self.new_blob == _NO_BLOB

    @property
    def added(self) -> bool:
        return self.old_blob == _NO_BLOB


@dataclass(frozen=True)
class ForkWheel:
    """A built fork wheel and what it holds."""

    path: Path
    sha256: str
    size: int
    release: str
    version: str
    tag: str
    series_sha256: str
    patches: tuple[str, ...]
    files: tuple[str, ...]
    source: str
    source_sha256: str
    state: str  # "written", "unchanged" (the same bytes were there) or "replaced"

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": True,
            "path": str(self.path),
            "name": self.path.name,
            "sha256": self.sha256,
            "size": self.size,
            "release": self.release,
            "version": self.version,
            "tag": self.tag,
            "series_sha256": self.series_sha256,
            "patches": list(self.patches),
            "files": list(self.files),
            "source": {"wheel": self.source, "sha256": self.source_sha256},
            "state": self.state,
        }


def python_tag(python: str) -> str:
    """The CPython tag (cp312) of an interpreter, asked by running it."""
    code = "import sys; print(sys.implementation.name, *sys.version_info[:2])"
    try:
        result = run_command([python, "-c", code])
    except OSError as exc:
        raise UsageError(
            f"cannot run {python}: {exc.strerror or exc}",
            hint="name a Python with --python PATH, or a tag with --python-tag",
        ) from None
    words = result.stdout.split()
    if not result.ok or len(words) != 3:
        raise UsageError(f"{python} did not say its version: {result.stderr.strip()}")
    if words[0] != "cpython":
        raise UsageError(
            f"{python} is {words[0]}, and sglang's wheels are for CPython only"
        )
    return f"cp{words[1]}{words[2]}"


def source_date_epoch() -> int:
    """SOURCE_DATE_EPOCH from the environment, or the fixed default."""
    value = os.environ.get("SOURCE_DATE_EPOCH", "")
    if not value:
        return DEFAULT_EPOCH
    if not value.isdigit():
        raise UsageError(f"SOURCE_DATE_EPOCH={value!r} is not a number of seconds")
    return int(value)


def _source_pin(pin: Pin, release: str, tag: str) -> Pin:
    """The pinned release wheel for `tag`; a file with no recorded hash is refused."""
    wanted = pin.for_wheel(release, tag)
    if not wanted.pinned:
        raise IntegrityError(
            f"patches/upstream.toml records no sha256 for {wanted.wheel}: it "
            "cannot be checked, so nothing was built",
            hint=f"get it with 'pip download --no-deps --only-binary=:all: "
            f"--python-version {wanted.python_version} --implementation cp "
            f"--platform {pin.platform} {pin.project}=={release}', and add its "
            f'sha256sum as {tag} = "..." under [wheels."{release}"]',
        )
    return wanted


def tree_changes(git: Git, base: str, head: str, pin: Pin) -> list[Change]:
    """Each file the commits base..head change, as the wheel member it is."""
    prefixes = [target for _source, target in pin.layout]
    raw = git.run(
        "diff", "--raw", "-z", "--no-renames", "--full-index", "--no-abbrev",
        base, head, "--", *prefixes,
    ).stdout  # fmt: skip
    fields = raw.split("\0")
    changes: list[Change] = []
    for i in range(0, len(fields) - 1, 2):
        meta, path = fields[i].split(), fields[i + 1]
        if len(meta) < 5:
            continue
        member = pin.member_of(path)
        if member is None:
            continue
        changes.append(Change(member, meta[2], meta[3], meta[1] == "100755"))
    return sorted(changes, key=lambda c: c.member)


def _dist_info(names: list[str], project: str, release: str, wheel: str) -> str:
    """The wheel's one `<name>-<release>.dist-info` folder."""
    found = sorted({n.split("/", 1)[0] for n in names if ".dist-info/" in n})
    expected = [d for d in found if d.lower() == f"{project}-{release}.dist-info"]
    if len(found) != 1 or not expected:
        raise WheelError(
            f"{wheel} holds {', '.join(found) or 'no dist-info'}, not one "
            f"{project}-{release}.dist-info",
            hint="this is not the release's wheel: get the file again",
        )
    return expected[0]


def _with_version(metadata: bytes, version: str) -> bytes:
    """METADATA with its Version header replaced (the headers end at a blank)."""
    lines = metadata.decode("utf-8").splitlines(keepends=True)
    for i, line in enumerate(lines):
        if not line.strip():
            break
        if line.lower().startswith("version:"):
            lines[i] = f"Version: {version}\n"
            return "".join(lines).encode("utf-8")
    raise WheelError("the wheel's METADATA has no Version header")


def _applied_tree(
    project: Project,
    release: str,
    wheel: FetchedWheel,
    progress: bool,
    on_patch: ProgressHook | None,
) -> tuple[Git, str, str]:
    """The series applied to `release` in build/fork/<release> (a scratch tree the
    tool owns; an unchanged one answers from its record): (git, base, head)."""
    tree = project.build_dir / "fork" / release
    request = ScratchRequest(
        tree=tree, version=release, wheel=wheel.path, progress=progress
    )
    report = build_scratch(project, request, on_patch)
    bad = report.problems + [o.name for o in report.patches if not o.status.ok]
    if bad:
        raise SeriesError(
            f"the series does not apply to sglang {release} ({', '.join(bad)}): "
            "nothing was built",
            hint=f"run 'xpu-series check --upstream {release}' to see why",
        )
    git = Git(tree)
    return git, read_record(git)["base"], report.head


def _plan(
    archive: zipfile.ZipFile,
    wheel: str,
    changes: list[Change],
    contents: dict[str, bytes],
    identity: dict[str, Any],
    project: str,
) -> dict[str, zipfile.ZipInfo | Member]:
    """Every entry of the fork wheel by name: a source member to copy, or new
    content. Refuses (nothing written) when a file the series changes is not the
    one it was applied to."""
    release, version = identity["release"], identity["version"]
    infos = {i.filename: i for i in archive.infolist() if not i.is_dir()}
    dist_info = _dist_info(list(infos), project, release, wheel)
    mismatched = []
    for change in changes:
        info = infos.get(change.member)
        before = None if info is None else blob_id(archive.read(info))
        if before != (None if change.added else change.old_blob):
            mismatched.append(change.member)
    if mismatched:
        raise IntegrityError(
            f"{wheel} holds {len(mismatched)} file(s) that are not the ones the "
            f"series was applied to: {', '.join(mismatched)}. Nothing was built",
            hint="a release's wheels for each Python carry the same .py files: "
            "check the hashes in patches/upstream.toml",
        )
    new_dist = f"{project}-{version}.dist-info"
    data_dir = f"{dist_info.removesuffix('.dist-info')}.data/"
    plan: dict[str, zipfile.ZipInfo | Member] = {}
    for name, info in infos.items():
        if name.startswith(f"{dist_info}/"):
            name = new_dist + name[len(dist_info) :]
        elif name.startswith(data_dir):
            name = f"{project}-{version}.data/" + name[len(data_dir) :]
        plan[name] = info
    plan.pop(f"{new_dist}/RECORD", None)  # written last, from what is written
    for change in changes:
        if change.deleted:
            del plan[change.member]
        else:
            data = contents[change.new_blob]
            plan[change.member] = stored(change.member, data, change.executable)

    def read(leaf: str) -> bytes | None:
        info = infos.get(f"{dist_info}/{leaf}")
        return None if info is None else archive.read(info)

    meta = read("METADATA")
    if meta is None:
        raise WheelError(f"{wheel} has no {dist_info}/METADATA")
    new = {
        "METADATA": _with_version(meta, version),
        ENTRY_POINTS: with_plugin(read(ENTRY_POINTS)),
        RECORD_NAME: record_bytes(identity),
    }
    tops = read("top_level.txt")
    if tops is not None:
        names = sorted({*tops.decode("utf-8").split(), PLUGIN_PACKAGE})
        new["top_level.txt"] = "".join(f"{n}\n" for n in names).encode()
    for leaf, data in new.items():
        plan[f"{new_dist}/{leaf}"] = stored(f"{new_dist}/{leaf}", data)
    plan[PLUGIN_MODULE] = stored(PLUGIN_MODULE, plugin_source())
    return plan


def _entries(
    archive: zipfile.ZipFile,
    raw: BinaryIO,
    plan: dict[str, zipfile.ZipInfo | Member],
    dist_info: str,
) -> Iterator[Member]:
    """The plan in order: package files sorted, then the dist-info sorted, RECORD
    last (it lists everything before it, each file hashed as written)."""
    rows: list[list[str]] = []
    for name in sorted(plan, key=lambda n: (n.startswith(f"{dist_info}/"), n)):
        entry = plan[name]
        if isinstance(entry, Member):
            member, data = entry, entry.payload
        else:
            try:
                data = archive.read(entry)  # checks the CRC the copy carries
            except (zipfile.BadZipFile, EOFError, OSError) as exc:
                raise WheelError(f"{entry.filename} is corrupt ({exc})") from None
            member = copied(raw, entry, name)
        rows.append([name, record_hash(data), str(len(data))])
        yield member
    record = f"{dist_info}/RECORD"
    rows.append([record, "", ""])
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    yield stored(record, out.getvalue().encode("utf-8"))


def _place(tmp: Path, final: Path, force: bool) -> str:
    """Rename the finished file in; an existing different wheel only with force."""
    if final.is_file():
        if _sha256(final) == _sha256(tmp):
            tmp.unlink()
            return "unchanged"
        if not force:
            tmp.unlink()
            raise TreeError(
                f"{final} exists and is a different wheel: it was left as it is",
                hint="move it away, or pass --force to replace it",
            )
        os.replace(tmp, final)
        return "replaced"
    os.replace(tmp, final)
    return "written"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def build_fork_wheel(
    project: Project,
    request: WheelRequest,
    say: Callable[[str], None] | None = None,
    on_patch: ProgressHook | None = None,
) -> ForkWheel:
    """Build `sglang-<release>+xpu.s<sha>-<tags>.whl` into `request.out`.

    Refused before anything is written: a release the series does not serve, a
    release wheel whose sha256 is not the recorded one (or has none recorded),
    and a file of another tag that is not the one the series was applied to.
    """
    say = say or (lambda _line: None)
    pin = project.pin
    release = request.version or pin.version
    if not pin.serves(release):
        low = pin.serves_from or pin.version
        raise IntegrityError(
            f"the series serves sglang {low} to {pin.version}, not {release}: "
            "nothing was built",
            hint=f"name a release from {low} to {pin.version} with --upstream",
        )
    tag = request.tag or pin.python_tag
    if not _TAG.match(tag):
        raise UsageError(
            f"{tag!r} is not a CPython tag", hint="e.g. --python-tag cp312"
        )
    source_pin = _source_pin(pin, release, tag)
    tree_pin = _source_pin(pin, release, pin.python_tag)
    cache = project.cache_dir
    say(f"release wheel {source_pin.wheel}")
    source = fetch_wheel(
        source_pin, cache, local=request.local, progress=request.progress
    )
    check_wheel(source.path, source_pin)
    tree_wheel = (
        source
        if tree_pin.wheel == source_pin.wheel
        else fetch_wheel(tree_pin, cache, progress=request.progress)
    )
    say(f"the series on sglang {release} in {project.build_dir / 'fork' / release}")
    git, base, head = _applied_tree(
        project, release, tree_wheel, request.progress, on_patch
    )
    changes = tree_changes(git, base, head, pin)
    contents = read_blobs(git.repo, [c.new_blob for c in changes if not c.deleted])
    series = project.series(release)
    identity = describe_series(project, release, series, request.revision)
    identity["source"] = {"wheel": source_pin.wheel, "sha256": source.sha256}
    identity["files"] = {
        c.member: "" if c.deleted else hashlib.sha256(contents[c.new_blob]).hexdigest()
        for c in changes
    }
    tags = source_pin.wheel[len(f"{pin.project}-{release}-") : -len(".whl")]
    final = request.out / f"{pin.project}-{identity['version']}-{tags}.whl"
    with zipfile.ZipFile(source.path) as archive, source.path.open("rb") as raw:
        plan = _plan(
            archive, source_pin.wheel, changes, contents, identity, pin.project
        )
        say(f"writing {final}")
        request.out.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{final.name}.partial-{os.getpid()}")
        new_dist = f"{pin.project}-{identity['version']}.dist-info"
        try:
            with tmp.open("wb") as out:
                entries = _entries(archive, raw, plan, new_dist)
                write_zip(out, entries, source_date_epoch())
            state = _place(tmp, final, request.force)
        finally:
            tmp.unlink(missing_ok=True)
    return ForkWheel(
        path=final,
        sha256=_sha256(final),
        size=final.stat().st_size,
        release=release,
        version=identity["version"],
        tag=tag,
        series_sha256=identity["series_sha256"],
        patches=tuple(p["name"] for p in identity["patches"]),
        files=tuple(identity["files"]),
        source=source_pin.wheel,
        source_sha256=source.sha256,
        state=state,
    )
