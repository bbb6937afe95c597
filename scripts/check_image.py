#!/usr/bin/env python3
"""CI: build docker/Dockerfile the way `xpu-serve --fork` does, on a stand-in base.

The official base, lmsysorg/sglang:v<V>-xpu, cannot be pulled here, so a stand-in
with its layout is made and tagged with its name: root, CMD ["bash"], no
entrypoint, a virtualenv at /opt/venv on PATH, and sglang <V> installed into it
from the release wheel by pip (not editable, --no-deps, with its RECORD). Its root
filesystem is Debian's (mmdebstrap). Debian has no Python 3.12, which the official
image has, in the release whose python3 runs the pinned cp311 wheels: bookworm's
3.11 it is (and git, which the official image has too). Then, for the pin and
the oldest served release (which goes through patches/overlay/<V>.diff), buildah
builds docker/Dockerfile with the build arguments `scripts/xpu-serve --fork`
passes (FORK_INSTALL's default, overlay), and for the pin also with
FORK_INSTALL=wheel, and each image is checked. For the wheel mode the fork wheel
for the stand-in's Python is built here first, into docker/wheels/ (as the
Dockerfile's comment tells users; an older build of the same name is replaced),
and the build installs it from there: a build has no package index to make it
itself. Checked in each image:

- `xpu-series overlay --status` inside it exits 0: every file intact (overlay),
  or no overlay at all (wheel);
- the installed sglang reports the series' local label (`<V>+xpu.s<sha>`);
- the `sglang.srt.plugins` entry point is found and, called, logs the line naming
  the series and no warning; the dist-info's xpu_series.json names the series;
- the OCI labels (version, revision, base name, series sha256) are what
  `xpu-series overlay --describe` and `git rev-parse HEAD` say;
- the `xpu-series` launcher install-fork.sh put on PATH runs.

Last, a base whose patched file differs from the release goes through the pin's
default build (buildah's --from swaps the FROM image), which must fail with the
overlay's message and a non-zero exit. Everything is kept by content under
<cache>/images/: a warm run builds nothing. Without buildah or mmdebstrap it says
so and skips; under CI=true, as root, it installs them with apt-get.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "scripts")]

from image_build import (  # noqa: E402
    INSTALL_HINT,
    Buildah,
    BuildFailed,
    RootfsSpec,
    Unreachable,
    content_key,
    install_tools,
    log,
    make_rootfs,
    tools_missing,
    tree_digest,
)
from xpu_series.errors import NetworkError  # noqa: E402
from xpu_series.fork.wheel import WheelRequest, build_fork_wheel  # noqa: E402
from xpu_series.project import Project  # noqa: E402
from xpu_series.stack.wheel import FetchedWheel, fetch_wheel  # noqa: E402

# bookworm: its python3 (3.11) is the one the pinned cp311 wheels are for. git:
# the official image has it (sglang is cloned there), and the wheel mode's build
# applies the series with it.
ROOTFS = RootfsSpec("bookworm", ("python3", "python3-venv", "git"))
STANDIN_TAG = "cp311"  # bookworm's python3
WHEELS = ROOT / "docker" / "wheels"  # the build mounts it (FORK_INSTALL=wheel)
VENV = "/opt/venv"
PATH = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LAUNCHER = "/usr/local/bin/xpu-series"  # docker/Dockerfile: install-fork.sh --bin
# What docker/Dockerfile's build context holds (.dockerignore keeps the rest out).
CONTEXT = (
    "docker/Dockerfile",
    ".dockerignore",
    "docker/install-fork.sh",
    "docker/wheels",
    "patches",
    "python/xpu_series",
)
OURS = "localhost/sglang-xpu-ci"  # content-named images: base, broken, fork, ...
# docker/Dockerfile's FORK_INSTALL: the default first; every release gets it,
# the pin gets the others too.
MODES = ("overlay", "wheel")
BROKEN_LINE = "# changed by check_image.py: a base whose file is not the release's"

# Run inside the fork image by its own python3: what the checks read.
PROBE = r"""
import importlib.metadata as md, importlib.util, json, os, shutil, subprocess, sys
def run(*cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    return {"code": p.returncode, "out": p.stdout, "err": p.stderr[-2000:]}
# As sglang loads it: the entry point of its plugin group, called.
LOAD_PLUGIN = (
    "import importlib.metadata as m\n"
    "found = m.entry_points(group='sglang.srt.plugins', name='xpu_series')\n"
    "print(len(found))\n"
    "for ep in found:\n"
    "    ep.load()()\n"
)
dist = md.distribution("sglang")
spec = importlib.util.find_spec("sglang")
print(json.dumps({
    "uid": os.getuid(),
    "prefix": sys.prefix,
    "python": "%d.%d" % sys.version_info[:2],
    "sglang": spec.origin if spec else "",
    "version": dist.version,
    "record": bool(dist.read_text("RECORD")),
    "direct_url": dist.read_text("direct_url.json") or "",
    "launcher": shutil.which("xpu-series") or "",
    "tool": run("xpu-series", "--version"),
    "status": run("xpu-series", "--json", "overlay", "--status", "--python", "python3"),
    "series_record": dist.read_text("xpu_series.json") or "",
    "plugin": run(sys.executable, "-c", LOAD_PLUGIN),
}))
"""


def load_serve() -> ModuleType:
    """scripts/xpu-serve as a module: its fork_build is the build users run."""
    path = ROOT / "scripts" / "xpu-serve"
    loader = importlib.machinery.SourceFileLoader("xpu_serve", str(path))
    spec = importlib.util.spec_from_loader("xpu_serve", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


SERVE = load_serve()


def describe(release: str) -> dict:
    """`xpu-series overlay --describe --upstream <release>`, as JSON."""
    proc = subprocess.run(
        [sys.executable, "-m", "xpu_series", "-C", str(ROOT), "--json", "overlay",
         "--describe", "--upstream", release],
        capture_output=True, text=True, check=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT / "python")),
    )  # fmt: skip
    return json.loads(proc.stdout)


def git_head() -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip


def expected_labels(release: str, fork: dict, revision: str) -> dict[str, str]:
    """The labels a fork image of `release` must carry: `fork` is what overlay
    --describe says of the release, `revision` what git says of the checkout."""
    return {
        "org.opencontainers.image.version": fork["version"],
        "org.opencontainers.image.revision": revision,
        "org.opencontainers.image.base.name": SERVE.stock_image(release),
        "io.sglang-xpu.series.sha256": fork["series_sha256"],
        "io.sglang-xpu.upstream.version": release,
    }


def bud_args(docker: list[str], tags: list[str], from_image: str = "") -> list[str]:
    """xpu-serve's `docker build` argv as buildah's: the same Dockerfile, build
    arguments and context; `tags` instead of its -t; `from_image` replaces FROM."""
    if docker[:2] != ["docker", "build"]:
        raise ValueError(f"not a docker build: {docker[:2]}")
    rest, context = docker[2:-1], docker[-1]
    kept: list[str] = []
    i = 0
    while i < len(rest):
        if rest[i] == "-t":
            i += 2
            continue
        kept.append(rest[i])
        i += 1
    args = ["bud", "--isolation", "chroot", "--pull=never"]
    if from_image:
        args += ["--from", from_image]
    for tag in tags:
        args += ["-t", tag]
    return [*args, *kept, context]


def judge(
    expected: dict[str, str], config: dict, facts: dict, mode: str = MODES[0]
) -> list[str]:
    """Each way the built image falls short of the fork image users get ([] if
    none): its labels, its config, and what was read inside it (an overlay whose
    files are intact; for `wheel`, none: pip installed the series' files)."""
    problems = []
    labels = config.get("Labels") or {}
    for key, want in expected.items():
        if labels.get(key) != want:
            problems.append(f"label {key} is {labels.get(key)!r}, not {want!r}")
    if config.get("Cmd") != ["bash"] or config.get("Entrypoint"):
        problems.append(
            f"CMD {config.get('Cmd')} and entrypoint {config.get('Entrypoint')}: "
            'the official layout is CMD ["bash"] and no entrypoint'
        )
    env = dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e)
    if env.get("PATH", "").split(":")[0] != f"{VENV}/bin":
        problems.append(f"PATH {env.get('PATH')!r} does not start with {VENV}/bin")
    if facts.get("uid") != 0:
        problems.append(f"it runs as uid {facts.get('uid')}, not root")
    site = f"{VENV}/lib/python{facts.get('python')}/site-packages/"
    if facts.get("prefix") != VENV or not str(facts.get("sglang")).startswith(site):
        problems.append(
            f"python3 is {facts.get('prefix')} and imports sglang from "
            f"{facts.get('sglang')}, not {site}"
        )
    if not facts.get("record") or '"editable": true' in facts.get("direct_url", ""):
        problems.append("sglang is not a non-editable pip install with a RECORD")
    if facts.get("version") != expected["org.opencontainers.image.version"]:
        problems.append(
            f"the installed sglang reports {facts.get('version')}, not "
            f"{expected['org.opencontainers.image.version']} (the series' label)"
        )
    status = facts.get("status") or {}
    if status.get("code") != 0:
        problems.append(
            f"xpu-series overlay --status exited {status.get('code')}: "
            f"{status.get('err', '').strip()}"
        )
    elif mode != "overlay":
        prov = json.loads(status["out"]).get("provenance")
        if prov:
            problems.append(
                f"overlay --status finds an overlay of series "
                f"{prov.get('series_sha256')}: FORK_INSTALL={mode} writes none"
            )
    else:
        data = json.loads(status["out"])
        prov = data.get("provenance") or {}
        files = data.get("files") or []
        bad = [f["path"] for f in files if f.get("state") != "intact"]
        if prov.get("series_sha256") != expected["io.sglang-xpu.series.sha256"]:
            problems.append(
                f"the overlay installed is of series {prov.get('series_sha256')}"
            )
        if not files or bad:
            problems.append(
                f"overlay --status: not every file intact ({bad or 'none'})"
            )
    tool = facts.get("tool") or {}
    if facts.get("launcher") != LAUNCHER or tool.get("code") != 0:
        problems.append(
            f"the xpu-series on PATH is {facts.get('launcher') or 'missing'} "
            f"(exit {tool.get('code')}), not a running {LAUNCHER}"
        )
    return problems


def judge_plugin(expected: dict[str, str], facts: dict) -> list[str]:
    """Each way the series' plugin falls short in the image ([] if none): the
    record in sglang's dist-info names the series, and the entry point, called
    as sglang calls it, logs the one line naming the series and no warning."""
    problems = []
    sha = expected["io.sglang-xpu.series.sha256"]
    try:
        record = json.loads(facts.get("series_record") or "{}")
    except ValueError:
        record = {}
    if not isinstance(record, dict) or record.get("series_sha256") != sha:
        got = record.get("series_sha256") if isinstance(record, dict) else record
        problems.append(f"sglang's xpu_series.json names series {got}, not {sha}")
    plugin = facts.get("plugin") or {}
    found = str(plugin.get("out", "")).strip()
    said = [x for x in str(plugin.get("err", "")).splitlines() if "sglang-xpu:" in x]
    if plugin.get("code") != 0 or found != "1":
        problems.append(
            f"the sglang.srt.plugins entry point xpu_series: {found or 'none'} "
            f"found (exit {plugin.get('code')})"
        )
    elif len(said) != 1 or f"sglang-xpu: series s{sha[:12]} " not in said[0]:
        problems.append(
            f"the plugin says {said}, not one line naming series s{sha[:12]}"
        )
    return problems


class Run:
    """One run's store and project, and what it made and read."""

    def __init__(self, project: Project, say: Callable[[str], None] = log) -> None:
        self.project = project
        self.say = say
        self.folder = project.cache_dir / "images"
        self.buildah = Buildah(self.folder)
        self.report: dict[str, dict] = {}

    def retag(self, image: str, name: str) -> None:
        self.buildah.run("tag", image, name)

    def prune(self, repository: str, prefix: str, keep: str) -> None:
        """Drop this release's images of an older recipe or input, with every
        other name they have (never read again: every name here is a content
        key, and xpu-serve's tag has moved to the new image)."""
        kept = self.buildah.image_id(keep)
        for name in self.buildah.images(repository):
            if not name.split(":", 1)[1].startswith(prefix) or name == keep:
                continue
            old = self.buildah.image_id(name)
            if old and old != kept:
                self.buildah.run("rmi", "--force", old, check=False)

    def python(self, rootfs: Path) -> str:
        """The root filesystem with the virtualenv on PATH, as the official image
        has them (one image every release's base starts from); its content name."""
        key = content_key("python", rootfs.name, VENV, PATH)
        name = f"{OURS}/python:{key[:16]}"
        b = self.buildah
        if b.image_id(name):
            self.say(f"python base: cached ({name})")
            return name
        start = time.monotonic()
        ctr = b.run("from", "--quiet", "scratch").stdout.strip()
        try:
            self.say(f"python base: {rootfs.name[:16]} and python3 -m venv {VENV}")
            b.run("add", "--quiet", ctr, str(rootfs), "/")
            b.inside(ctr, "python3", "-m", "venv", VENV)
            b.run(
                "config", "--cmd", '["bash"]', "--entrypoint", "[]",
                "--env", f"PATH={PATH}", "--env", f"VIRTUAL_ENV={VENV}", ctr,
            )  # fmt: skip
            b.run("commit", "--quiet", "--squash", ctr, name)
        finally:
            b.run("rm", ctr, check=False)
        self.prune(f"{OURS}/python", "", name)
        self.say(f"python base: made in {time.monotonic() - start:.1f}s")
        return name

    def base(self, release: str, wheel: FetchedWheel, python: str) -> str:
        """The stand-in for lmsysorg/sglang:v<release>-xpu; its content name."""
        where = f"/tmp/{wheel.path.name}"
        pip = [f"{VENV}/bin/python", "-m", "pip", "install", "--no-deps",
               "--no-index", "--no-compile", "--no-cache-dir",
               "--disable-pip-version-check", where]  # fmt: skip
        b = self.buildah
        key = content_key("base", b.image_id(python), wheel.sha256, pip)
        name = f"{OURS}/base:v{release}-{key[:16]}"
        stock = SERVE.stock_image(release)
        if b.image_id(name):
            self.say(f"{release}: base {stock}: cached ({name})")
            self.retag(name, stock)
            return name
        start = time.monotonic()
        ctr = b.container(python)
        try:
            self.say(f"{release}: base {stock}: " + " ".join(pip))
            b.run("copy", "--quiet", ctr, str(wheel.path), where)
            b.inside(ctr, *pip)
            b.inside(ctr, "rm", where)
            b.run(
                "config", "--label", "io.sglang-xpu.stand-in=not the official "
                f"image: Debian {ROOTFS.suite}'s python3 and sglang {release} from "
                "its wheel", ctr,
            )  # fmt: skip
            b.run("commit", "--quiet", ctr, name)
        finally:
            b.run("rm", ctr, check=False)
        self.retag(name, stock)
        self.prune(f"{OURS}/base", f"v{release}-", name)
        self.say(f"{release}: base made in {time.monotonic() - start:.1f}s")
        return name

    def fork(
        self, release: str, base: str, mode: str
    ) -> tuple[str, list[str], str, str]:
        """docker/Dockerfile built as xpu-serve builds it (for a mode other than
        the default, with its FORK_INSTALL); the image, its argv, the commit git
        named just before xpu-serve made the argv, and the image's tag."""
        head = git_head()
        tag, docker = SERVE.fork_build(release)
        repository = f"{OURS}/fork"
        if mode != MODES[0]:
            docker = [*docker[:-1], "--build-arg", f"FORK_INSTALL={mode}", docker[-1]]
            tag, repository = f"{tag}-{mode}", f"{repository}-{mode}"
        b = self.buildah
        key = content_key(
            "fork", b.image_id(base), docker[2:], tree_digest(ROOT, CONTEXT)
        )
        name = f"{repository}:v{release}-{key[:16]}"
        say = f"{release} {mode}: "
        self.say(f"{say}the build xpu-serve --fork runs: " + " ".join(docker))
        if b.image_id(name):
            self.say(f"{say}fork image {tag}: cached ({name})")
            self.retag(name, tag)
            return name, docker, head, tag
        start = time.monotonic()
        code, _ = b.stream(bud_args(docker, [tag, name]), self.say, say)
        if code != 0:
            raise BuildFailed(f"building {tag} exited {code} (its output is above)")
        self.prune(repository, f"v{release}-", name)
        self.say(f"{say}fork image built in {time.monotonic() - start:.1f}s")
        return name, docker, head, tag

    def check(
        self, release: str, image: str, head: str, mode: str
    ) -> tuple[list[str], dict]:
        expected = expected_labels(release, describe(release), head)
        config = self.buildah.config(image)
        ctr = self.buildah.container(image)
        try:
            probe = self.buildah.inside(ctr, "python3", "-c", PROBE)
        finally:
            self.buildah.run("rm", ctr, check=False)
        facts = json.loads(probe.stdout)
        problems = judge(expected, config, facts, mode)
        return problems + judge_plugin(expected, facts), {
            "labels": {k: (config.get("Labels") or {}).get(k) for k in expected},
            "version": facts["version"],
            "status": json.loads(facts["status"]["out"] or "{}"),
        }

    def broken(
        self, release: str, base: str, docker: list[str], status: dict
    ) -> list[str]:
        """The same build on a base whose first patched file is not the
        release's: it must fail, with the overlay's message."""
        rel = status["files"][0]["path"]
        target = f"{status['site']}/{rel}"
        b = self.buildah
        key = content_key("broken", b.image_id(base), target, BROKEN_LINE)
        name = f"{OURS}/broken:v{release}-{key[:16]}"
        if b.image_id(name):
            self.say(f"{release}: broken base: cached ({name}; {rel} changed)")
        else:
            ctr = b.container(base)
            try:
                b.inside(ctr, "sh", "-c", 'printf "\\n%s\\n" "$1" >> "$0"', target,
                         BROKEN_LINE)  # fmt: skip
                b.run("commit", "--quiet", ctr, name)
            finally:
                b.run("rm", ctr, check=False)
            self.prune(f"{OURS}/broken", f"v{release}-", name)
            self.say(f"{release}: broken base: {rel} changed ({name})")
        failed = f"{OURS}/broken-fork:v{release}"
        code, out = b.stream(
            bud_args(docker, [failed], from_image=name),
            self.say,
            f"{release}: broken: ",
        )
        message = f"the series patches are not sglang {release}'s: {rel} (differs"
        problems = []
        if code == 0:
            b.run("rmi", failed, check=False)
            problems.append("the build on a broken base succeeded")
        if message not in out:
            problems.append(
                f"the build's output lacks the overlay's message {message!r}"
            )
        self.report[f"{release}-broken"] = {"exit": code, "file": rel}
        if not problems:
            self.say(
                f"{release}: broken base: the build failed as it must (exit {code})"
            )
        return problems

    def release(
        self, release: str, python: str, modes: tuple[str, ...], broken: bool
    ) -> list[str]:
        """Each mode's fork image of `release` built and checked (`broken`: and
        the default mode's build on a broken base refused)."""
        start = time.monotonic()
        try:
            wheel = fetch_wheel(
                self.project.pin.for_version(release), self.project.cache_dir
            )
        except NetworkError as exc:
            self.say(f"{release}: skipped: {exc.message}")
            return []
        base = self.base(release, wheel, python)
        if "wheel" in modes:
            # Before any build: the context (and so every image's key) holds it.
            self.fork_wheel(release)
        problems = []
        for mode in modes:
            found = self.mode(release, base, mode, broken and mode == MODES[0])
            problems += [f"{mode}: {p}" for p in found]
        verdict = "ok" if not problems else "FAILED"
        self.say(f"{release}: {verdict} in {time.monotonic() - start:.1f}s")
        return problems

    def fork_wheel(self, release: str) -> None:
        """The fork wheel FORK_INSTALL=wheel installs, built as a user builds
        it: `xpu-series wheel --python-tag <the stand-in's> --out docker/wheels`."""
        start = time.monotonic()
        request = WheelRequest(out=WHEELS, version=release, tag=STANDIN_TAG, force=True)
        built = build_fork_wheel(self.project, request)
        how = "unchanged" if built.state == "unchanged" else "built"
        self.say(
            f"{release} wheel: {built.path.relative_to(ROOT)} {how} in "
            f"{time.monotonic() - start:.1f}s (sha256 {built.sha256[:12]}...)"
        )

    def mode(self, release: str, base: str, mode: str, broken: bool) -> list[str]:
        image, docker, head, tag = self.fork(release, base, mode)
        problems, read = self.check(release, image, head, mode)
        key = release if mode == MODES[0] else f"{release}-{mode}"
        self.report[key] = {"image": tag, "mode": mode, **read}
        say = f"{release} {mode}: "
        for label, value in read["labels"].items():
            self.say(f"{say}label {label}={value}")
        for problem in problems:
            self.say(f"{say}{problem}")
        if not problems:
            files = read["status"].get("files") or []
            how = (
                f"overlay --status: {len(files)} of {len(files)} files intact"
                if mode == "overlay"
                else "installed by pip, no overlay"
            )
            self.say(
                f"{say}sglang {read['version']}; {how}; the plugin names the "
                f"series; {LAUNCHER} runs"
            )
        if broken and not problems:
            problems += self.broken(release, base, docker, read["status"])
        return problems


def tools_ready(say: Callable[[str], None] = log) -> str:
    """'' when buildah and mmdebstrap can run here; else why the build skips."""
    missing = tools_missing()
    root = os.geteuid() == 0
    if missing and root and os.environ.get("CI") == "true":
        install_tools(say)
        return ""
    if missing:
        return (
            f"skipped: {' and '.join(missing)} not installed: the fork image is "
            f"not built here\nhint: {INSTALL_HINT}, then run 'scripts/test image'"
        )
    if not root:
        return (
            "skipped: buildah builds the fork image as root only here (its own "
            "storage, chroot isolation)\nhint: run 'sudo scripts/test image'"
        )
    return ""


def main(argv: list[str] | None = None) -> int:
    project = Project(ROOT)
    pin = project.pin
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "releases",
        nargs="*",
        help=f"default: the pin ({pin.version}) and {pin.serves_from or pin.version}",
    )
    args = parser.parse_args(argv)
    releases = args.releases or list(
        dict.fromkeys([pin.version, pin.serves_from or pin.version])
    )
    start = time.monotonic()
    try:
        why = tools_ready()
        if why:
            log(why)
            return 0
        run = Run(project)
        run.buildah.run("rm", "--all", check=False)  # an interrupted run's
        python = run.python(make_rootfs(ROOTFS, run.folder / "rootfs", log))
        failed = []
        for release in releases:
            # The pin in every mode; an older release in the default one only.
            modes = MODES if release == pin.version else MODES[:1]
            problems = run.release(release, python, modes, release == pin.version)
            failed += [f"{release}: {p}" for p in problems]
    except Unreachable as exc:
        log(f"skipped: {exc}")
        log("hint: run it where Debian's archive can be reached")
        return 0
    except BuildFailed as exc:
        log(f"error: {exc}")
        log("hint: the output above names the step; scripts/check_image.py reruns it")
        return 1
    reports = ROOT / "build" / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    (reports / "image.json").write_text(json.dumps(run.report, indent=2) + "\n")
    for problem in failed:
        log(f"error: {problem}")
    if failed:
        log("hint: build/reports/image.json has what was read from each image")
        return 1
    took = time.monotonic() - start
    log(f"fork images checked in {took:.1f}s ({', '.join(releases)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
