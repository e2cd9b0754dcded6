"""Every committed campaign plan (results/*/*.txt) is one that train.py would run: each cell's overrides
compose with the real config and pass the launch's checks (as on a GPU), so a typo is found here, not on a
lent GPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

import harness.config  # noqa: F401  (registers the structured schema)
from harness.check import preflight

ROOT = Path(__file__).resolve().parents[1]
PLANS = sorted(ROOT.glob("results/*/*.txt"))


def _campaign():
    spec = importlib.util.spec_from_file_location("campaign", ROOT / "tools" / "campaign.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_plans_are_found() -> None:
    names = {str(plan.relative_to(ROOT)) for plan in PLANS}
    assert {"results/kimi_fig4_h200/campaign.txt", "results/kimi_hybrid_h200/campaign.txt"} <= names


@pytest.mark.parametrize("plan", PLANS, ids=[str(p.relative_to(ROOT / "results")) for p in PLANS])
def test_every_cell_of_a_committed_plan_composes_and_passes_preflight(
    plan: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # checked as on the GPU the plans run on, where the Triton kernels' size limits apply
    monkeypatch.setattr("harness.check.resolve_device", lambda spec, job_num=None: torch.device("cuda", 0))
    campaign = _campaign()
    cells = campaign.expand(campaign.read_plan(plan))
    assert cells
    # the sweep's own settings (hydra.*) are not part of a run's config; one check a distinct run config.
    # optim.lr=best is the campaign's to pick from the lrs the cell's runs took: composed without it.
    # A seed changes only the data drawn, so the seeds of one config are checked on one of them, and every
    # seed value of the plan is composed at least once.
    best = (campaign.BEST_KEY, campaign.BEST)
    runs, configs_seen, seeds_seen = [], set(), set()
    for cell in cells:
        key = tuple(sorted((k, v) for k, v in cell.values.items()
                           if not k.startswith("hydra") and (k, v) != best))
        config, seed = tuple((k, v) for k, v in key if k != "seed"), dict(key).get("seed")
        if config not in configs_seen or seed not in seeds_seen:
            runs.append((key, cell))
            configs_seen.add(config)
            seeds_seen.add(seed)
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        for key, cell in runs:
            overrides = [f"{k}={v}" for k, v in key]
            try:
                preflight(compose("config", overrides=overrides))
            except Exception as error:  # noqa: BLE001  (any failure is the plan's: name the cell)
                pytest.fail(f"{plan.name}, {cell!r}: {type(error).__name__}: {error}")
