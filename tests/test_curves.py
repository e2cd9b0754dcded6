"""analysis.curves: runs that differ in one setting, judged against the spread of others (seeds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis import curves


def _run(root: Path, name: str, losses: dict[int, float], extra: dict | None = None) -> Path:
    run = root / name
    run.mkdir(parents=True)
    lines = [json.dumps({"step": step, "train/loss": loss, **(extra or {})}) for step, loss in losses.items()]
    # an eval record without the metric is skipped, not read as a gap
    lines.insert(1, json.dumps({"step": 2, "eval/acc": 0.5}))
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run


def test_a_run_is_judged_by_the_seeds_range_at_each_common_step(tmp_path: Path) -> None:
    seed0 = _run(tmp_path, "seed0", {1: 9.0, 50: 8.0, 100: 6.0, 150: 4.0})
    seed1 = _run(tmp_path, "seed1", {1: 9.0, 50: 8.2, 100: 5.0, 150: 3.9})
    seed2 = _run(tmp_path, "seed2", {1: 9.0, 50: 7.9, 100: 5.5, 150: 4.2})
    # logged at one more step than the others: only the common steps are compared
    form = _run(tmp_path, "form", {1: 9.0, 50: 8.25, 100: 5.9, 150: 4.5, 200: 3.0})
    out = tmp_path / "report" / "curves.md"
    assert curves.main([f"compiled={form}", "--spread", str(seed0), str(seed1), str(seed2),
                        "--out", str(out)]) == 0
    text = out.read_text()
    assert ("| step | compiled | seed0 | seed1 | seed2 | spread of seed0, seed1, seed2 "
            "| |compiled - seed0| |") in text
    assert "| 50 | 8.2500 | 8.0000 | 8.2000 | 7.9000 | 0.3000 | 0.2500 |" in text
    assert "| 200 |" not in text and "| 2 |" not in text
    # gaps 0, 0.25, 0.1, 0.5 against spreads 0, 0.3, 1.0, 0.3: within at steps 1, 50 and 100
    assert ("- compiled: within the spread of seed0, seed1, seed2 at 3 of 4 steps; largest gap 0.5000 at "
            "step 150 (the spread there 0.3000)") in text


def test_bad_input_is_named_before_anything_is_written(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    run = _run(tmp_path, "a", {1: 1.0, 2: 0.5})
    other = _run(tmp_path, "b", {3: 1.0})
    out = tmp_path / "out.md"
    assert curves.main([str(run), "--spread", str(other), "--out", str(out)]) == 2
    assert "at no common step" in capsys.readouterr().err and not out.exists()
    assert curves.main([str(run), "--spread", str(other), "--metric", "train/acc", "--out", str(out)]) == 2
    assert "logs no 'train/acc'" in capsys.readouterr().err and not out.exists()
    assert curves.main([str(tmp_path / "nothing"), "--spread", str(run)]) == 2
    assert "no metrics.jsonl there" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        curves.main([f"a={other}", "--spread", str(run)])  # 'a' names b's run above, not a/
    assert "'a' already names" in capsys.readouterr().err
