"""The commit a benchmark row names is the code that ran."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from benchmarks import common


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


def test_a_row_names_head_and_says_where_the_code_differs_from_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    (repo / "kernels").mkdir(parents=True)
    (repo / "kernels" / "op.py").write_text("x = 1\n")
    (repo / "notes.md").write_text("a\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    head = _git(repo, "rev-parse", "--short", "HEAD")
    monkeypatch.setattr(common, "ROOT", repo)
    monkeypatch.delenv("KDA_COMMIT", raising=False)
    assert common.commit() == head
    # a file the figures do not depend on leaves the label as it is
    (repo / "notes.md").write_text("b\n")
    assert common.commit() == head
    # the code that runs differs from HEAD (edited, or synced onto an older clone): said
    (repo / "kernels" / "op.py").write_text("x = 2\n")
    assert common.commit() == f"{head}+modified"
    (repo / "kernels" / "op.py").write_text("x = 1\n")
    (repo / "kernels" / "new.py").write_text("y = 1\n")
    assert common.commit() == f"{head}+modified"
    # the caller's name wins; no git at all is "unknown"
    monkeypatch.setenv("KDA_COMMIT", "abc1234")
    assert common.commit() == "abc1234"
    monkeypatch.delenv("KDA_COMMIT")
    monkeypatch.setattr(common, "ROOT", tmp_path / "nowhere")
    assert common.commit() == "unknown"
