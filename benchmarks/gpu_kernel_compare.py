"""The timings of benchmarks/gpu_kernel_compare.sh side by side: OUT/rev/bench_*/h200_bench.csv against
OUT/tree/bench_*/h200_bench.csv, the median over the rounds of each (shape, op, implementation, pass), and
the working tree's over REV's, as a markdown table.

    python benchmarks/gpu_kernel_compare.py OUT REV
"""

from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path

PASSES = ("ms_fwd", "ms_fwdbwd")


def medians(folder: Path) -> dict[tuple[str, str, str, str], float]:
    """(shape, op, impl, pass) -> the median ms over the bench_*/h200_bench.csv files under folder
    (entries that are not numbers, a skip or an error, left out)."""
    found: dict[tuple[str, str, str, str], list[float]] = {}
    for path in sorted(folder.glob("bench_*/h200_bench.csv")):
        with path.open() as f:
            for row in csv.DictReader(f):
                for name in PASSES:
                    try:
                        ms = float(row.get(name) or "")
                    except ValueError:
                        continue
                    found.setdefault((row["shape"], row["op"], row["impl"], name), []).append(ms)
    return {key: statistics.median(values) for key, values in found.items()}


def table(before: dict, after: dict, rev: str) -> list[str]:
    """Markdown lines: one row per key of either side, REV's ms, the working tree's and their ratio."""
    lines = [
        f"| shape | op | impl | pass | {rev} ms | working tree ms | tree / rev |",
        "|---|---|---|---|---|---|---|",
    ]
    for key in sorted(before.keys() | after.keys()):
        a, b = before.get(key), after.get(key)
        ratio = f"{b / a:.3f}" if a and b else "-"
        cells = [*key, f"{a:.4f}" if a else "-", f"{b:.4f}" if b else "-", ratio]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="gpu_kernel_compare.sh's OUT")
    ap.add_argument("rev", help="the revision's name, for the header")
    args = ap.parse_args()
    before, after = medians(args.out / "rev"), medians(args.out / "tree")
    if not before and not after:
        raise SystemExit(f"no bench_*/h200_bench.csv under {args.out}/rev or {args.out}/tree")
    ratios = [after[k] / before[k] for k in before.keys() & after.keys() if before[k] > 0]
    print(f"# GPU time, {args.rev} against the working tree (median of each side's rounds)\n")
    print("\n".join(table(before, after, args.rev)))
    if ratios:
        print(
            f"\ntree / rev over {len(ratios)} timings: median {statistics.median(ratios):.3f}, "
            f"min {min(ratios):.3f}, max {max(ratios):.3f}"
        )


if __name__ == "__main__":
    main()
