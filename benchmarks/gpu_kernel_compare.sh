#!/usr/bin/env bash
# Do the kernels of the working tree run on the GPU as those of a revision REV? In one call on one GPU:
# tests/gpu/check_kernels.py in both trees (errors against the token loop, within FLA's bounds), then
# benchmarks/bench_gpu.py in both trees, alternating REV and the working tree ROUNDS times (GPU time of
# every op, forward and forward+backward, at B32 T2K H2 and B8 T8K H16), and the timings side by side.
#
#   bash benchmarks/gpu_kernel_compare.sh OUT REV
#
# REV: a git revision (checked out with `git worktree` into a temporary folder), or a folder that holds the
# tree of one (kernels/, tests/, benchmarks/). A machine that has the checkout but not its history gets the
# folder from here, inside the checkout and ignored, carried along:
#
#   echo /.rev/ >> .git/info/exclude; rm -rf .rev; mkdir .rev
#   git archive REV kernels tests benchmarks | tar -x -C .rev        # then: ... OUT .rev
#
# Writes under OUT: rev/ and tree/ (each check/errors.csv, check.log, bench_N/h200_bench.csv, bench_N.log)
# and compare.md (ms per op, shape and pass: REV's and the working tree's medians over the rounds, their
# ratio). Exits 1 when a check is over its bounds (or failed) in either tree.
#
# From the environment: STEPS ("check bench", or one of them), ROUNDS (2), CHECK_ARGS (default
# "--T 63 1000 --H 16 --no-fla", about 90 s a tree on an H200), BENCH_ARGS (default "--skip-sweep
# --skip-decode --impls ours", about 60-90 s a tree and round), CHECK_LIMIT and BENCH_LIMIT (seconds a run:
# 240, 200). All of it fits the device's 600 s a command with ROUNDS=1; STEPS=check and STEPS=bench
# split it into two commands.
set -u
OUT="${1:?usage: bash benchmarks/gpu_kernel_compare.sh OUT REV}"
REV="${2:?usage: bash benchmarks/gpu_kernel_compare.sh OUT REV (a git revision or a folder holding its tree)}"
STEPS="${STEPS:-check bench}"
ROUNDS="${ROUNDS:-2}"
CHECK_ARGS="${CHECK_ARGS:---T 63 1000 --H 16 --no-fla}"
BENCH_ARGS="${BENCH_ARGS:---skip-sweep --skip-decode --impls ours}"
CHECK_LIMIT="${CHECK_LIMIT:-240}"
BENCH_LIMIT="${BENCH_LIMIT:-200}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

if [ -d "$REV" ]; then
  OLD="$(cd "$REV" && pwd)"
else
  tmp="$(mktemp -d)"
  OLD="$tmp/rev"
  git -C "$ROOT" worktree add --detach -q "$OLD" "$REV" || {
    echo "gpu_kernel_compare: $REV is neither a folder nor a git revision of $ROOT (see the header)" >&2
    rm -rf "$tmp"
    exit 2
  }
  trap 'git -C "$ROOT" worktree remove --force "$OLD"; rm -rf "$tmp"' EXIT
fi
for tree in "$OLD" "$ROOT"; do
  for f in tests/gpu/check_kernels.py benchmarks/bench_gpu.py kernels/triton/__init__.py; do
    [ -f "$tree/$f" ] || { echo "gpu_kernel_compare: $tree has no $f" >&2; exit 2; }
  done
done
echo "REV $REV ($OLD) against the working tree ($ROOT)" | tee "$OUT/sides.txt"
ok=0

side() {  # the folder under OUT for a tree
  if [ "$1" = "$ROOT" ]; then echo tree; else echo rev; fi
}

if [[ " $STEPS " == *" check "* ]]; then
  for tree in "$OLD" "$ROOT"; do
    dir="$OUT/$(side "$tree")"
    mkdir -p "$dir"
    # shellcheck disable=SC2086
    (cd "$tree" && timeout "$CHECK_LIMIT" python3 tests/gpu/check_kernels.py $CHECK_ARGS --out "$dir/check") \
      >"$dir/check.log" 2>&1
    rc=$?
    echo "check, $(side "$tree"): exit $rc, $(tail -n 1 "$dir/check.log")" | tee -a "$OUT/sides.txt"
    [ $rc -eq 0 ] || ok=1
  done
fi

if [[ " $STEPS " == *" bench "* ]]; then
  for round in $(seq 1 "$ROUNDS"); do
    for tree in "$OLD" "$ROOT"; do
      dir="$OUT/$(side "$tree")"
      mkdir -p "$dir"
      # shellcheck disable=SC2086
      (cd "$tree" && timeout "$BENCH_LIMIT" python3 benchmarks/bench_gpu.py $BENCH_ARGS --out "$dir/bench_$round") \
        >"$dir/bench_$round.log" 2>&1
      rc=$?
      echo "bench round $round, $(side "$tree"): exit $rc" | tee -a "$OUT/sides.txt"
    done
  done
  python3 "$ROOT/benchmarks/gpu_kernel_compare.py" "$OUT" "$REV" | tee "$OUT/compare.md"
fi
exit $ok
