"""benchmarks.run_steps: the step time of whole training runs, read back from their logs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from benchmarks import run_steps


def _run(path: Path, times: list[float], graphs: bool, peak: float | None,
         recompute: list[str] | None = None) -> None:
    path.mkdir(parents=True)
    steps = (1, 50, 100, 150, 200)
    rows = [{"step": s, "train/loss": 1.0, "time_s": t} for s, t in zip(steps, times, strict=True)]
    rows.insert(3, {"step": 100, "eval/acc": 0.5})  # an eval row: no time of its own
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"status": "completed", "mixer": "kda", "task": "palindrome", "seq_len": 2048, "compile": True,
               "cuda_graphs": graphs, "lean_backward": False, "steps": 200, "first_step_s": times[0],
               "gpu": {"name": "NVIDIA H100 80GB HBM3"}}
    if peak is not None:
        summary["peak_memory_gib"] = peak
        summary["train_peak_memory_gib"], summary["eval_peak_memory_gib"] = peak - 1.0, peak
    if recompute is not None:
        summary["recompute"] = recompute
    (path / "summary.json").write_text(json.dumps(summary))


def test_step_time_is_the_median_between_logged_steps_after_the_first(tmp_path: Path) -> None:
    # step 1 pays the compile (20 s); then 50 steps in 5 s, 5 s, and one slow interval (an eval's stall)
    _run(tmp_path / "false" / "a", [20.0, 25.0, 30.0, 35.0, 45.0], graphs=False, peak=12.5)
    _run(tmp_path / "auto" / "a", [10.0, 12.0, 14.0, 16.0, 18.0], graphs=True, peak=None,
         recompute=["mlp", "qk"])
    assert run_steps.step_ms(tmp_path / "false" / "a" / "metrics.jsonl") == pytest.approx(100.0)
    assert run_steps.main([str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    table = pd.read_csv(tmp_path / "out" / "run_steps.csv").set_index("run")
    assert table.loc["false/a", "step_ms"] == 100.0 and table.loc["auto/a", "step_ms"] == 40.0
    assert table.loc["false/a", "peak_gib"] == 12.5 and pd.isna(table.loc["auto/a", "peak_gib"])
    assert table.loc["false/a", "train_peak_gib"] == 11.5 and table.loc["false/a", "eval_peak_gib"] == 12.5
    assert pd.isna(table.loc["false/a", "recompute"]) and table.loc["auto/a", "recompute"] == "mlp,qk"
    text = (tmp_path / "out" / "run_steps.md").read_text()
    assert "runs on NVIDIA H100 80GB HBM3" in text and "| auto/a | completed | kda |" in text


def test_no_finished_run_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        run_steps.main([str(tmp_path), "--out", str(tmp_path / "out")])
    assert f"no summary.json under {tmp_path}: no run has finished there" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
