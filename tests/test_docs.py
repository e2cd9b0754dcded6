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
# a default stated beside joblib_gpu: "`local` with `jobs_per_gpu: 3`", "(`n_jobs: null`", "local with
# jobs_per_gpu=3"; not an override such as `hydra.launcher.n_jobs=6`, which is an example, not the default
DEFAULT = re.compile(r"(?<![.\w])(n_jobs|jobs_per_gpu)[:=] ?(\w+)")
# the packing arithmetic left to the user ("n_jobs=6` for 3 per GPU on 2 GPUs"): jobs_per_gpu does it
ARITHMETIC = re.compile(r"n_jobs=\d+`? for \d+ (?:runs )?per GPU")


def test_joblib_gpu_is_stated_as_the_yaml_sets_it_with_runs_per_gpu_as_jobs_per_gpu() -> None:
    stated = {key: "null" if value is None else str(value)
              for key, value in yaml.safe_load(JOBLIB_GPU.read_text()).items()}
    assert stated["n_jobs"] == "null" and int(stated["jobs_per_gpu"]) >= 1
    wrong = []
    for path in TEXTS:
        text = path.read_text()
        name = path.relative_to(ROOT)
        for number, line in enumerate(text.splitlines(), 1):
            if "joblib_gpu" in line and not line.lstrip().startswith("python"):
                wrong += [f"{name}:{number}: {key} {value} (the yaml: {stated[key]})"
                          for key, value in DEFAULT.findall(line) if value != stated[key]]
        flat = " ".join(line.lstrip("# ") for line in text.splitlines())
        wrong += [f"{name}: {found!r}: the runs per GPU are hydra.launcher.jobs_per_gpu's, not an n_jobs to "
                  "compute" for found in ARITHMETIC.findall(flat)]
        if "jobs_per_gpu" not in text:
            wrong.append(f"{name}: describes joblib_gpu without jobs_per_gpu")
    assert not wrong, "\n".join(wrong)
