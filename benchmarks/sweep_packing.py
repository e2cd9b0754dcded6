"""Pack several training runs on one GPU with joblib_gpu, and measure what it buys against a serial sweep.

    python -m benchmarks.sweep_packing --jobs 4 --out /tmp/packing          # on a machine with a GPU

Runs the same grid twice through Hydra multirun with `trainer.device=auto`: once with
`hydra/launcher=joblib_gpu hydra.launcher.n_jobs=<jobs>` (several runs at once, assigned to the GPUs
round-robin) and once with the basic launcher (one run after the other). While the packed sweep runs,
`nvidia-smi` is polled every half second for the processes on each GPU. Writes packing.md and
packing.csv (wall time of each sweep, the most processes seen on each GPU, every run's status, device
and final accuracy from its summary.json) into --out, and exits 1 if a run did not complete or no
GPU ever held more than one run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

from benchmarks.common import ROOT, provenance, write_csv

# (grid, common overrides) per preset. smoke: small runs, quick; paper: 8 runs of Kimi's synthetic setting
# (2 layers, 2 heads x 128, B=256, MQAR at T=1024 with vocab 8192), the size a Fig. 4 sweep packs
PRESETS = {
    "smoke": (
        ["mixer=kda,gdn,mamba2,attention", "optim.lr=1e-3,3e-3"],
        ["experiment=smoke", "trainer.device=auto", "logger.wandb.mode=disabled", "trainer.max_steps=800",
         "task.seq_len=64", "model.d_model=64", "trainer.eval_every=500"],
    ),
    "paper": (
        ["mixer=kda,gdn,mamba2,attention", "optim.lr=5e-4,1e-3"],
        ["trainer=paper", "task=mqar", "task.seq_len=1024", "task.num_train=20000", "task.num_eval=512",
         "trainer.max_steps=300", "trainer.eval_every=300", "trainer.device=auto",
         "logger.wandb.mode=disabled"],
    ),
}
GRID, COMMON = PRESETS["smoke"]


def gpu_processes() -> dict[str, int]:
    """Number of compute processes per GPU (by bus id) right now."""
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=gpu_bus_id,pid", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    ).stdout
    counts: dict[str, int] = defaultdict(int)
    for line in out.strip().splitlines():
        if line.strip():
            counts[line.split(",")[0].strip()] += 1
    return dict(counts)


def run_sweep(name: str, launcher: list[str], sweep_dir: Path, poll: bool) -> tuple[float, dict[str, int]]:
    cmd = [sys.executable, "train.py", "-m", *COMMON, *GRID, *launcher, f"hydra.sweep.dir={sweep_dir}"]
    print("$", " ".join(cmd), flush=True)
    peak: dict[str, int] = defaultdict(int)
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for gpu, n in gpu_processes().items():
                peak[gpu] = max(peak[gpu], n)
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    if poll:
        watcher.start()
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.time() - t0
    done.set()
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
        raise SystemExit(f"{name} sweep exited {proc.returncode}")
    print(f"{name}: {wall:.1f} s, processes per GPU at most {dict(peak)}", flush=True)
    return wall, dict(peak)


def runs_of(sweep_dir: Path) -> list[dict]:
    rows = []
    for summary in sorted(sweep_dir.rglob("summary.json")):
        s = json.loads(summary.read_text())
        log = (summary.parent / "train.log").read_text() if (summary.parent / "train.log").exists() else ""
        marks = [ln.split("| device ")[1] for ln in log.splitlines() if "| device " in ln]
        device = marks[0].split(" |")[0] if marks else "?"
        rows.append(
            {
                "run": str(summary.parent.relative_to(sweep_dir)),
                "status": s.get("status"),
                "device": device,
                "final_acc": s.get("final_eval_acc", s.get("best_eval_acc")),
                "wall_s": s.get("wall_time_s", s.get("elapsed_s")),
            }
        )
    return rows


def report(out: Path, jobs: int, wall_p: float, peak: dict, wall_s: float | None, rows: list[dict]) -> None:
    """packing.csv and packing.md; written after the packed sweep and again after the serial one."""
    write_csv(out / "packing.csv", rows, ["run", "status", "device", "final_acc", "wall_s"])
    lines = [
        f"# Packing runs on a GPU with joblib_gpu ({provenance()})",
        "",
        f"Grid: {' '.join(GRID)}; common overrides: {' '.join(COMMON)}.",
        "",
        f"- packed (joblib_gpu, n_jobs={jobs}): {wall_p:.1f} s wall; most processes seen per GPU: {peak}",
    ]
    if wall_s is not None:
        # the same runs both ways: aggregate throughput is tokens / wall, so its ratio is the wall's
        lines.append(f"- serial (basic launcher): {wall_s:.1f} s wall; packed throughput / serial "
                     f"{wall_s / wall_p:.2f}x")
    else:
        lines.append("- serial (basic launcher): not finished (yet)")
    lines += ["", "| run | status | device | final acc | wall s |", "|---|---|---|---|---|"]
    lines += [
        f"| {r['run']} | {r['status']} | {r['device']} | {r['final_acc']} | {r['wall_s']} |" for r in rows
    ]
    (out / "packing.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=4, help="runs at once (joblib_gpu n_jobs)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--skip-serial", action="store_true")
    ap.add_argument("--preset", choices=list(PRESETS), default="smoke",
                    help="smoke: small runs; paper: 8 runs at Kimi's synthetic setting (B=256, T=1024)")
    args = ap.parse_args()
    global GRID, COMMON
    GRID, COMMON = PRESETS[args.preset]
    args.out.mkdir(parents=True, exist_ok=True)
    packed_dir = args.out / "packed"
    wall_p, peak = run_sweep(
        "packed", ["hydra/launcher=joblib_gpu", f"hydra.launcher.n_jobs={args.jobs}"], packed_dir, poll=True
    )
    rows = runs_of(packed_dir)
    # written now too: a serial sweep cut short by a time limit leaves the packed result behind
    report(args.out, args.jobs, wall_p, peak, None, rows)
    bad = [r for r in rows if r["status"] != "completed"]
    if bad or not peak or max(peak.values()) < 2:
        raise SystemExit(f"packing check failed: {len(bad)} runs not completed, peak processes {peak}")
    if not args.skip_serial:
        wall_s, _ = run_sweep("serial", ["hydra/launcher=basic"], args.out / "serial", poll=False)
        report(args.out, args.jobs, wall_p, peak, wall_s, rows)


if __name__ == "__main__":
    main()
