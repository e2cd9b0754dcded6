"""Training curves of runs that differ in one setting, set against the spread between seeds.

    python -m analysis.curves eager=results/fast_step_check/eager compiled=results/fast_step_check/compiled \
        --spread eager results/fast_step_check/eager_seed1 results/fast_step_check/eager_seed2

Each RUN is a run directory (LABEL=DIR names its column; else the directory's name). At every step all runs
logged, the table gives each run's metric (`--metric`, train loss by default); `--spread` names the runs
whose range at a step (largest minus smallest) is the tolerance there, the same step with other seeds. Every
run outside the spread is judged against the first spread run, the reference: its gap at each step, and the
steps where the gap is within the spread. One seed's run repeated with the same seed would show the step's
own nondeterminism instead; seeds show how far training itself wanders, the scale a change of step form
must stay within to be called the same science.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from harness.rundir import read_metrics


def _label_and_dir(text: str) -> tuple[str, Path]:
    label, sep, path = text.partition("=")
    if sep and label and "/" not in label:
        return label, Path(path)
    return Path(text).name, Path(text)


def read_curve(run: Path, metric: str) -> dict[int, float]:
    """{step: value} of `metric` in run/metrics.jsonl (the records that log it)."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        raise ValueError(f"{run}: no metrics.jsonl there; give a run directory (one train.py run)")
    records, _ = read_metrics(path)
    curve = {r["step"]: float(r[metric]) for r in records if isinstance(r.get(metric), (int, float))}
    if not curve:
        raise ValueError(f"{run}/metrics.jsonl logs no {metric!r}; pick --metric from its keys, e.g. "
                         "train/loss, train/acc, eval/acc")
    return curve


def compare(curves: dict[str, dict[int, float]], spread: list[str]) -> dict[str, Any]:
    """The table and the verdicts: rows (step, values in label order, spread, gaps), the reference, and
    for each run outside the spread (steps within it, steps compared, largest gap, its step, the spread
    there)."""
    steps = sorted(set.intersection(*(set(c) for c in curves.values())))
    if not steps:
        raise ValueError("the runs log the metric at no common step: compare runs of one schedule")
    reference = spread[0]
    judged = [label for label in curves if label not in spread]
    rows, verdicts = [], {label: {"within": 0, "steps": 0, "gap": 0.0, "at": None, "spread": None}
                          for label in judged}
    for step in steps:
        values = [curves[label][step] for label in curves]
        seeds = [curves[label][step] for label in spread]
        width = max(seeds) - min(seeds) if len(seeds) > 1 else None
        gaps = {}
        for label in judged:
            gap = abs(curves[label][step] - curves[reference][step])
            gaps[label] = gap
            verdict = verdicts[label]
            verdict["steps"] += 1
            verdict["within"] += width is not None and gap <= width
            if verdict["at"] is None or gap > verdict["gap"]:
                verdict.update(gap=gap, at=step, spread=width)
        rows.append({"step": step, "values": values, "spread": width, "gaps": gaps})
    return {"rows": rows, "reference": reference, "verdicts": verdicts}


def render(curves: dict[str, dict[int, float]], spread: list[str], metric: str,
           result: dict[str, Any]) -> str:
    labels = list(curves)
    judged = list(result["verdicts"])
    reference = result["reference"]
    head = ["step", *labels]
    if len(spread) > 1:
        head.append(f"spread of {', '.join(spread)}")
    head += [f"|{label} - {reference}|" for label in judged]
    lines = [f"{metric} at every step all {len(labels)} runs logged", "",
             "| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for row in result["rows"]:
        cells = [f"{row['step']:,}", *(f"{v:.4f}" for v in row["values"])]
        if len(spread) > 1:
            cells.append(f"{row['spread']:.4f}")
        cells += [f"{row['gaps'][label]:.4f}" for label in judged]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for label, verdict in result["verdicts"].items():
        largest = f"largest gap {verdict['gap']:.4f} at step {verdict['at']:,}"
        if len(spread) < 2:
            lines.append(f"- {label}: {largest} (one run in --spread: no spread to judge it by)")
            continue
        lines.append(f"- {label}: within the spread of {', '.join(spread)} at {verdict['within']} of "
                     f"{verdict['steps']} steps; {largest} (the spread there {verdict['spread']:.4f})")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.curves", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run directories (LABEL=DIR names a column)")
    parser.add_argument("--spread", nargs="+", required=True,
                        help="the runs (labels or directories) whose range is the tolerance; the first is "
                        "the reference the others are judged against")
    parser.add_argument("--metric", default="train/loss", help="a key of metrics.jsonl (default train/loss)")
    parser.add_argument("--out", type=Path, default=None, help="also write the table to this markdown file")
    args = parser.parse_args(argv)
    runs = dict(_label_and_dir(text) for text in args.runs)
    spread = []
    for text in args.spread:
        label, path = _label_and_dir(text)
        named = text == label  # a label of the positional runs, not a directory
        if label in runs and not named and runs[label].resolve() != path.resolve():
            parser.error(f"--spread {text}: {label!r} already names {runs[label]}; give it LABEL=DIR")
        if label not in runs:
            if named and not path.is_dir():
                parser.error(f"--spread {text}: neither a run given above nor a directory")
            runs[label] = path
        spread.append(label)
    if len(set(spread)) != len(spread):
        parser.error(f"--spread {' '.join(args.spread)}: a run named twice")
    try:
        curves = {label: read_curve(path, args.metric) for label, path in runs.items()}
        result = compare(curves, spread)
    except ValueError as error:
        print(f"analysis.curves: {error}", file=sys.stderr)
        return 2
    text = render(curves, spread, args.metric, result)
    print(text, end="")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
