"""The one place that runs subprocesses: git (and pip, through `run_command`),
and the end of a long-lived worker (`stop_worker`)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from xpu_series.errors import GitError

# Identity and settings that make every commit we create reproducible and keep the
# user's global git configuration (signing, hooks, autocrlf) out of the tree.
_IDENTITY = {
    "GIT_AUTHOR_NAME": "xpu-series",
    "GIT_AUTHOR_EMAIL": "xpu-series@localhost",
    "GIT_COMMITTER_NAME": "xpu-series",
    "GIT_COMMITTER_EMAIL": "xpu-series@localhost",
    "GIT_CONFIG_NOSYSTEM": "1",
    # A user's global diff/format settings (noprefix, algorithm, signatures) would
    # change exported bytes; the tree and the patches must not depend on them.
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_TERMINAL_PROMPT": "0",
    "LC_ALL": "C",
}
_CONFIG = (
    "-c", "commit.gpgsign=false",
    "-c", "tag.gpgsign=false",
    "-c", "core.autocrlf=false",
    "-c", "core.hooksPath=/dev/null",
    "-c", "init.defaultBranch=main",
    "-c", "gc.auto=0",
    "-c", "advice.detachedHead=false",
    "-c", "am.threeWay=false",
    "-c", "am.keepcr=false",
    "-c", "format.signature=",
)  # fmt: skip


@dataclass(frozen=True)
class Completed:
    """Captured result of one command."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def run_command(
    args: Sequence[str],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    input_text: str | None = None,
    capture: bool = True,
) -> Completed:
    """Run a command; output is captured unless the caller wants it shown."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    proc = subprocess.run(
        list(args),
        cwd=cwd,
        env=full_env,
        input=input_text,
        text=True,
        capture_output=capture,
        check=False,
    )
    return Completed(tuple(args), proc.returncode, proc.stdout or "", proc.stderr or "")


def stop_worker(
    proc: subprocess.Popen[str] | subprocess.Popen[bytes], grace_s: float = 30
) -> None:
    """End a worker that reads jobs on stdin: close its stdin (its signal to
    finish), wait up to `grace_s`, then kill it."""
    try:
        if proc.stdin is not None:
            proc.stdin.close()
    except OSError:  # it died with a job half written: nothing to flush
        pass
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Git:
    """git bound to one repository, with reproducible identity and settings."""

    def __init__(self, repo: Path) -> None:
        self.repo = Path(repo)

    def run(
        self,
        *args: str,
        check: bool = True,
        env: Mapping[str, str] | None = None,
        input_text: str | None = None,
    ) -> Completed:
        full_env = dict(_IDENTITY)
        if env:
            full_env.update(env)
        result = run_command(
            ["git", *_CONFIG, *args],
            cwd=self.repo,
            env=full_env,
            input_text=input_text,
        )
        if check and not result.ok:
            lines = (result.stderr or result.stdout).strip().splitlines()
            text = result.stderr + result.stdout
            if "Read-only file system" in text or "Permission denied" in text:
                raise GitError(
                    f"{self.repo} is not writable (git {args[0]}: "
                    f"{lines[-1] if lines else 'no output'})",
                    hint="make it writable and run the same command again",
                )
            raise GitError(
                f"git {' '.join(args[:2])} failed in {self.repo}: "
                f"{lines[-1] if lines else 'no output'}",
                hint=f"inspect the tree with 'git -C {self.repo} status'",
            )
        return result

    def feed(self, args: Sequence[str], chunks: Iterable[bytes]) -> None:
        """Run a git command that reads a (large) binary stream on stdin."""
        env = {**os.environ, **_IDENTITY}
        proc = subprocess.Popen(
            ["git", *_CONFIG, *args],
            cwd=self.repo,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdin is not None
        try:
            for chunk in chunks:
                proc.stdin.write(chunk)
            proc.stdin.close()
        except BrokenPipeError:
            pass  # git stopped reading; its exit status and stderr say why
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        if proc.wait() != 0:
            lines = stderr.strip().splitlines()
            raise GitError(
                f"git {args[0]} failed in {self.repo}: "
                f"{lines[-1] if lines else 'no output'}"
            )

    def out(self, *args: str) -> str:
        return self.run(*args).stdout.strip()

    def is_repo(self) -> bool:
        if not (self.repo / ".git").exists():
            return False
        return self.run("rev-parse", "--git-dir", check=False).ok

    def rev(self, ref: str) -> str | None:
        result = self.run(
            "rev-parse", "--verify", "-q", f"{ref}^{{commit}}", check=False
        )
        return result.stdout.strip() if result.ok else None

    def dirty_paths(self) -> list[str]:
        """Tracked changes and untracked files, as porcelain lines."""
        out = self.run("status", "--porcelain", "--untracked-files=all").stdout
        return [line for line in out.splitlines() if line.strip()]

    def git_dir(self) -> Path:
        """The repository's git folder. At a work tree's top, read off `.git`
        (a folder, or a worktree's `gitdir:` file) without running git: the
        tree's record is read and written through here many times a command."""
        dot = self.repo / ".git"
        if dot.is_dir():
            return dot
        if dot.is_file():
            first = dot.read_text(errors="replace").partition("\n")[0]
            if first.startswith("gitdir: "):
                path = Path(first[len("gitdir: ") :].strip())
                return path if path.is_absolute() else self.repo / path
        path = Path(self.out("rev-parse", "--git-dir"))
        return path if path.is_absolute() else self.repo / path


def read_blobs(repo: Path, blobs: Sequence[str]) -> dict[str, bytes]:
    """The contents of many blobs at once (`git cat-file --batch`), by blob id."""
    if not blobs:
        return {}
    proc = subprocess.run(
        ["git", *_CONFIG, "cat-file", "--batch"],
        cwd=repo,
        input=b"".join(f"{b}\n".encode() for b in blobs),
        capture_output=True,
        check=False,
    )
    if proc.returncode != 0:
        raise GitError(
            f"git cat-file failed in {repo}: "
            f"{proc.stderr.decode(errors='replace').strip() or 'no output'}"
        )
    out: dict[str, bytes] = {}
    data, pos = proc.stdout, 0
    while pos < len(data):
        end = data.index(b"\n", pos)
        head = data[pos:end].split()
        if len(head) < 3:  # "<id> missing"
            raise GitError(f"blob {head[0].decode()} is missing from {repo}")
        size = int(head[2])
        out[head[0].decode()] = data[end + 1 : end + 1 + size]
        pos = end + 1 + size + 1
    return out
