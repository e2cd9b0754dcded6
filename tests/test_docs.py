"""What the README, docs/ and the configs' own comments state about a config, checked against the config."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
JOBLIB_GPU = ROOT / "conf" / "hydra" / "launcher" / "joblib_gpu.yaml"
# where the launchers are described
TEXTS = [ROOT / "README.md", ROOT / "docs" / "sweeps.md", ROOT / "conf" / "hydra" / "help" / "train.yaml",
         JOBLIB_GPU]
# "`local` with `n_jobs: 3`", "(`n_jobs: 3`", "local with n_jobs=3"; not an override such as
# `hydra.launcher.n_jobs=6`, which is an example, not the default
DEFAULT = re.compile(r"(?<![.\w])n_jobs[:=] ?(\d+)")
# an example of the packing arithmetic: "n_jobs=6` for 3 per GPU on 2 GPUs"
EXAMPLE = re.compile(r"n_jobs=(\d+)`? for (\d+) (?:runs )?per GPU on (\d+) GPUs")


def test_joblib_gpu_n_jobs_is_stated_as_the_yaml_sets_it_with_the_arithmetic_right() -> None:
    n_jobs = yaml.safe_load(JOBLIB_GPU.read_text())["n_jobs"]
    wrong, examples = [], 0
    for path in TEXTS:
        text = path.read_text()
        name = path.relative_to(ROOT)
        for number, line in enumerate(text.splitlines(), 1):
            if "joblib_gpu" in line and not line.lstrip().startswith("python"):
                wrong += [f"{name}:{number}: n_jobs {n} (the yaml: {n_jobs})" for n in DEFAULT.findall(line)
                          if int(n) != n_jobs]
        flat = " ".join(line.lstrip("# ") for line in text.splitlines())
        for total, per_gpu, gpus in EXAMPLE.findall(flat):
            examples += 1
            if int(total) != int(per_gpu) * int(gpus):
                wrong.append(f"{name}: n_jobs={total} for {per_gpu} per GPU on {gpus} GPUs")
        # every example of the arithmetic is one the pattern checks
        loose = len(re.findall(r"per GPU on \d+ GPUs", flat)) - len(EXAMPLE.findall(flat))
        if loose:
            wrong.append(f"{name}: {loose} 'per GPU on N GPUs' not as 'n_jobs=N for R per GPU on G GPUs'")
    assert not wrong, "\n".join(wrong)
    assert examples >= 3  # the yaml, docs/sweeps.md and the README each give one
