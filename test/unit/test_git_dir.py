"""Git.git_dir reads `.git` itself: it must name the folder git would."""

from __future__ import annotations

from pathlib import Path

from conftest import git

from xpu_series.git import Git


def _git_says(where: Path) -> Path:
    return Path(git(where, "rev-parse", "--absolute-git-dir")).resolve()


def test_git_dir_is_the_folder_git_names_for_a_repo_a_worktree_and_a_subfolder(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    (repo / "sub").mkdir(parents=True)
    git(repo, "init", "-q")
    (repo / "sub" / "f.txt").write_text("x\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "one")
    linked = tmp_path / "linked"
    git(repo, "worktree", "add", "-q", "--detach", str(linked), "HEAD")
    # A worktree's .git is a file naming its own folder under the repo's .git.
    assert (linked / ".git").is_file()
    for where in (repo, linked, repo / "sub"):
        assert Git(where).git_dir().resolve() == _git_says(where), where
    assert Git(linked).git_dir().resolve() != Git(repo).git_dir().resolve()
