"""docs/adding_a_mixer.md as a newcomer follows it: in a copy of the repository, add one module and one yaml
(a copy of Longhorn under a new name) and nothing else, then run the fast tier of the mixer and config tests
there. Every one of them must pass and the new mixer must be among the tested ones."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAME = "walkthrough_mixer"  # matched by `-k` below; no existing test id contains it

# What the fast tier needs is code and config; run outputs and committed results are left behind.
_NOT_COPIED = shutil.ignore_patterns(".git", "runs", "results", "outputs", "multirun", "wandb", "__pycache__",
                                     ".pytest_cache", ".ruff_cache", "*.egg-info", "*.pt")


def test_a_mixer_added_as_documented_passes_the_fast_tests(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(ROOT, repo, ignore=_NOT_COPIED)
    # The two files of the walk-through, and no other edit.
    module = (ROOT / "mixers" / "longhorn.py").read_text()
    module = module.replace("class Longhorn(", "class WalkthroughMixer(")
    (repo / "mixers" / f"{NAME}.py").write_text(module)
    yaml = (ROOT / "conf" / "mixer" / "longhorn.yaml").read_text()
    assert "_target_: mixers.longhorn.Longhorn\n" in yaml
    (repo / "conf" / "mixer" / f"{NAME}.yaml").write_text(
        yaml.replace("_target_: mixers.longhorn.Longhorn\n", f"_target_: mixers.{NAME}.WalkthroughMixer\n"))

    # The new mixer's own tests, and the ones over every mixer or every config (the grids, the main job).
    selection = f"{NAME} or every_yaml or grids_compose or main_job_and_experiments_compose"
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:xdist", "-p", "no:cacheprovider",
         "-m", "not slow", "-k", selection,
         "tests/test_mixers.py", "tests/test_model.py", "tests/test_sweeps.py", "tests/test_train.py"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=600,
    )
    said = result.stdout + result.stderr
    assert result.returncode == 0, said[-4000:]
    passed = re.findall(r"^PASSED (\S+)", result.stdout, flags=re.MULTILINE)
    own = [test for test in passed if NAME in test]
    # causality, decoding, every switch, state size, backends, unknown keys, yaml defaults, the backbone
    assert len(own) >= 10, said[-4000:]
    assert any("test_experiment_grids_compose" in test for test in passed), said[-4000:]
