#!/usr/bin/env bash
# One GPU session's measurements, most important first, each step under its own time limit, every result
# written under OUT (a directory given on the command line) as soon as it exists, so that a session cut
# short keeps what it measured.
#
#   bash benchmarks/gpu_session.sh OUT [STEPS]        STEPS: a subset of "check profile fla bench sweep packing"
#   PACK=FILE.tgz bash benchmarks/gpu_session.sh OUT [STEPS]      (also OUT as one archive after every step)
#
# Optional inputs, from the environment:
#   WHEELS            wheel files to make importable first (fla-core 0.6.0 for the side-by-side steps, Hydra's
#                     launchers for the packing step on a machine without a package index); installed with
#                     --no-deps into a temporary folder put on PYTHONPATH, never into the environment itself
#   AUTOTUNE_SEED     a folder of Triton autotuning results (*.autotune.json), e.g. an earlier session's
#                     OUT/triton_autotune, copied into the Triton cache first
#   TRITON_CACHE_DIR  Triton's cache (default ~/.triton/cache)
#
# FLA autotunes every kernel on first use (about 200 s per op and shape on an H200, longer than a short
# session for the whole table). Triton keeps the autotuning results in its cache; the script copies every
# *.autotune.json to OUT/triton_autotune/ after each step. Give that folder as AUTOTUNE_SEED next time and
# FLA's timings compile only the configs it chose instead of benchmarking all of them. (The cache key
# includes the Triton build, the GPU and FLA's source: the same image and versions reuse it.)
#
# Steps and their limits (seconds), about 14 minutes in all on an H200 for the default list:
#   check    240  bf16 correctness, all variants, T=63/1000 H=16 and KDA at T=8192 H=2; fp32 and fp16 at T=1000
#   profile  150  GPU time per kernel at B8 T8K H16, inference forward and fwd+bwd (benchmarks/profile_gpu.py)
#   fla      570  the two fixed shapes, ours and FLA and SDPA side by side (FLA's configs compiled in parallel first)
#   bench    120  the fixed shapes with the torch reference, and decode
#   sweep    120  T = 1K..64K at B=1 H=16, KDA, FLA and SDPA (with the settings `final` picked, if it ran)
#   packing  150  several training runs packed on the GPU (benchmarks/sweep_packing.py)
#   tune     320  (not in the default list) the session's alternatives checked, then per-kernel profiles of each
#                 (TUNE_ENTRIES="SETTING[,SETTING...]:OP[,OP...] ..." and TUNE_OPS override the lists)
#   tune2    200  (not in the default list) the older untried launch settings, profiled
#   verify   200  (not in the default list) after a kernel change: our kernels compiled in the background (default
#                 and ALT=KEY=VALUE[,KEY=VALUE]) while the defaults, ALT (on the ops ALT_OPS), T=8192, fp16 and
#                 FLA (one process per op) are checked
#   final    180  (not in the default list) default against ALT per kernel, then ours and SDPA timed with the faster
#   shapes   260  (not in the default list) correctness at K, V = 64/256 and chunk sizes 32, 16
#   occupancy 150 (not in the default list) registers, spills, shared memory and programs per SM of every
#                 launch, compiled by the device's Triton (benchmarks/occupancy.py; ALT's settings beside)
#   flacheck 240  (not in the default list) FLA's kernels against the same reference, beside ours
set -u
# the alternative settings of the verify, tune, final and occupancy steps (comma-joined kernels.triton.plan settings):
# ALT from the environment, else intra_fwd.warps=4 (the intra forward's 4 warps where the rule takes 2: GLA
# and the bounded gate's no-grad forward); the forms the kernels compute in are rules, not settings
ALT_OPS="${ALT_OPS:-kda_bounded kda gla delta_rule gated_delta_rule}"  # the ops ALT is checked and timed on
ALT="${ALT:-intra_fwd.warps=4}"
OUT="${1:?usage: bash benchmarks/gpu_session.sh OUT [STEPS]}"
STEPS="${2:-check profile fla bench sweep packing}"
mkdir -p "$OUT"
if [ -n "${WHEELS:-}" ]; then
  site=$(mktemp -d)
  # shellcheck disable=SC2086
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" $WHEELS
  export PYTHONPATH=$site:${PYTHONPATH:-}
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
quiet() { grep -v -i "warn"; }
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$HOME/.triton/cache}"
mkdir -p "$TRITON_CACHE_DIR"
if [ -n "${AUTOTUNE_SEED:-}" ]; then
  cp -r "$AUTOTUNE_SEED/." "$TRITON_CACHE_DIR/"
  echo "seeded the Triton cache with $(find "$AUTOTUNE_SEED" -name '*.autotune.json' | wc -l) autotuning results"
fi
save_autotune() {
  (cd "$TRITON_CACHE_DIR" && find . -name '*.autotune.json' | while read -r f; do
    mkdir -p "$OUT/triton_autotune/$(dirname "$f")" && cp "$f" "$OUT/triton_autotune/$f"
  done)
}
# every step's printout also goes to OUT/STEP.log: a remote runner may return only the tail of the output
exec 3>&1
for step in $STEPS; do
  exec > >(tee -a "$OUT/$step.log" >&3) 2>&1
  echo "== $step ($(date -u +%H:%M:%S))"
  case "$step" in
    check)
      timeout 90 python3 tests/gpu/check_kernels.py --T 63 1000 --H 16 --no-fla --out "$OUT/check_bf16" | quiet | tail -30
      timeout 30 python3 tests/gpu/check_kernels.py --T 8192 --H 2 --ops kda kda_bounded --out "$OUT/check_long" \
        | quiet | tail -6
      for d in fp32 fp16; do
        timeout 75 python3 tests/gpu/check_kernels.py --T 1000 --H 16 --ops kda_bounded gla delta_rule --dtype $d \
          --out "$OUT/check_$d" | quiet | tail -8
      done ;;
    profile)
      timeout 150 python3 benchmarks/profile_gpu.py --out "$OUT/profile.csv" | quiet | grep -v " 0\.[0-9]%" ;;
    tune)
      # the alternatives not yet run on a GPU, against the reference first (bf16, all ops, T=63/1000 H=16)
      # (skipped when the verify step has just checked them, with ALT set to both)
      [ -f "$OUT/check_alt/errors.csv" ] || timeout 100 python3 tests/gpu/check_kernels.py --T 63 1000 --H 16 --no-fla \
        --no-step --out "$OUT/check_alt" --set ${ALT//,/ } | quiet | tail -18
      # one profile per untried setting of kernels.triton.plan.SETTINGS, against the default just above
      # shellcheck disable=SC2086
      timeout 70 python3 benchmarks/profile_gpu.py --ops ${TUNE_OPS:-kda_bounded kda gla delta_rule linear_attn simple_gla} \
        --passes infer train --out "$OUT/profile_tune_default.csv" | quiet | grep -v " 0\.[0-9]%" | grep -v "^settings"
      # (what each setting did when tried: benchmarks/results/history.csv)
      # entries: SETTING[,SETTING...][:OP[,OP...]] (a comma joins settings tried together; the ops it affects).
      # The default: ALT's intra forward again, against the defaults (TUNE_ENTRIES overrides the list)
      for entry in ${TUNE_ENTRIES:-intra_fwd.warps=4:kda_bounded,gla}; do
        set=${entry%%:*}
        ops=${entry#*:}
        echo "-- --set $set ($ops)"
        # shellcheck disable=SC2086
        timeout 40 python3 benchmarks/profile_gpu.py --ops ${ops//,/ } --passes infer train --set ${set//,/ } \
          --out "$OUT/profile_tune_${set//[=,]/_}.csv" | quiet | grep -v " 0\.[0-9]%" | grep -v "^settings"
      done ;;
    verify)
      # after a kernel change, in little device time: our kernels for the benchmark shapes compile in the
      # background (with and without the alternative ALT, for the ops ALT_OPS) while the checks run
      pids=()
      for shape in B32T2K B8T8K; do
        for set in none "$ALT"; do
          # shellcheck disable=SC2046
          timeout 110 python3 benchmarks/bench_gpu.py --compile-only --impls ours --shapes "$shape" --out "$OUT/bench" \
            $([ "$set" = none ] || echo --set "${set//,/ }") 2>&1 | grep -e "^compile" >>"$OUT/compile.log" &
          pids+=($!)
        done
      done
      # the long, the fp16 and the FLA cross-checks side by side with the rest (correctness only: sharing the
      # GPU is harmless). FLA's kernels (bf16 at H = 2 and 16) reuse the autotuning results in the Triton cache
      # (AUTOTUNE_SEED), so they compile their chosen configs only (all ops at T = 2048 and 8192 with H = 2,
      # beside T = 63 and 1000 with H = 16 below)
      timeout 200 python3 tests/gpu/check_kernels.py --T 2048 8192 --H 2 --no-step --no-fla \
        --out "$OUT/check_long" >"$OUT/check_long.txt" 2>&1 &
      pids+=($!)
      # (one process per op: a single process compiles FLA's kernels one op after the other)
      # (simple GLA and the gated delta rule: FLA's forward only, its backward refuses Triton 3.6, #640)
      for op in kda_bounded kda gla delta_rule linear_attn simple_gla gated_delta_rule; do
        timeout 200 python3 tests/gpu/check_kernels.py --T 1000 --H 16 --ops $op --no-step --out "$OUT/check_fla_$op" \
          >"$OUT/check_fla_$op.txt" 2>&1 &
        pids+=($!)
      done
      timeout 110 python3 tests/gpu/check_kernels.py --T 1000 --H 16 --ops kda_bounded gla delta_rule --dtype fp16 \
        --no-step --no-fla --out "$OUT/check_fp16" >"$OUT/check_fp16.txt" 2>&1 &
      pids+=($!)
      timeout 100 python3 tests/gpu/check_kernels.py --T 63 1000 --H 16 --no-fla --out "$OUT/check_bf16" | quiet | tail -17
      # shellcheck disable=SC2086
      timeout 50 python3 tests/gpu/check_kernels.py --T 63 1000 --H 16 --no-fla --no-step --ops $ALT_OPS \
        --set ${ALT//,/ } --out "$OUT/check_alt" | quiet | tail -8
      wait "${pids[@]}"
      quiet <"$OUT/check_long.txt" | tail -16
      cat "$OUT"/check_fla_*.txt | quiet | grep -v "^op " | grep -v "^settings"
      quiet <"$OUT/check_fp16.txt" | tail -5
      echo "compiled: $(grep -c compiled "$OUT/compile.log") of 28" ;;
    final)
      # the default against ALT per kernel for the ops ALT_OPS, then the benchmark (ours, SDPA) with the
      # faster of the two for the first of them, forward+backward
      # shellcheck disable=SC2086
      timeout 35 python3 benchmarks/profile_gpu.py --ops $ALT_OPS --out "$OUT/profile_default.csv" | quiet \
        | grep -v " 0\.[0-9]%" | grep -v "^settings"
      # shellcheck disable=SC2086
      timeout 35 python3 benchmarks/profile_gpu.py --ops $ALT_OPS --out "$OUT/profile_alt.csv" --set ${ALT//,/ } \
        | quiet | grep -v " 0\.[0-9]%"
      pick=$(python3 - "$OUT/profile_default.csv" "$OUT/profile_alt.csv" "${ALT_OPS%% *}" <<'PY'
import csv, sys
op = sys.argv[3]
tot = [sum(float(r["ms"]) for r in csv.DictReader(open(f)) if r["op"] == op and r["pass"] == "train")
       for f in sys.argv[1:3]]
print("alt" if tot[1] < tot[0] else "default", file=sys.stderr)
print("yes" if tot[1] < tot[0] else "")
PY
)
      if [ -n "$pick" ]; then echo "--set ${ALT//,/ }" >"$OUT/pick_set.txt"; else : >"$OUT/pick_set.txt"; fi
      # shellcheck disable=SC2046
      timeout 100 python3 benchmarks/bench_gpu.py --out "$OUT/bench" --impls ours sdpa --skip-sweep --skip-decode \
        --budget-s 90 $(cat "$OUT/pick_set.txt") | quiet | grep -v "^|" ;;
    tune2)
      # launch settings not yet tried on the H200
      for set in intra_fwd.warps=2 intra_bwd.warps=2 wu.warps=4 intra_bwd.bk=128; do
        echo "-- --set $set"
        timeout 40 python3 benchmarks/profile_gpu.py --ops kda_bounded kda --passes train --set "$set" | quiet \
          | grep -v " 0\.[0-9]%" | grep -v "^settings"
      done ;;
    shapes)
      # head sizes other than 128 and chunk sizes other than 64, bf16, T=1000 H=4
      for kv in "64 64" "256 256" "64 128"; do
        set -- $kv
        timeout 60 python3 tests/gpu/check_kernels.py --T 1000 --H 4 --K "$1" --V "$2" --no-fla --no-step \
          --ops kda_bounded kda gla delta_rule linear_attn --out "$OUT/check_k$1_v$2" | quiet | tail -7
      done
      for c in 32 16; do
        timeout 40 python3 tests/gpu/check_kernels.py --T 1000 --H 4 --chunk $c --no-fla --no-step \
          --ops kda_bounded kda gated_delta_rule --out "$OUT/check_chunk$c" | quiet | tail -5
      done ;;
    occupancy)
      timeout 70 python3 benchmarks/occupancy.py --ops kda_bounded kda gla delta_rule \
        --out "$OUT/occupancy.csv" | quiet
      # shellcheck disable=SC2086
      timeout 70 python3 benchmarks/occupancy.py --ops kda_bounded delta_rule --set ${ALT//,/ } \
        --out "$OUT/occupancy_alt.csv" | quiet | grep -e "^#" -e intra ;;
    flacheck)
      # FLA's kernels measured against the same reference at T=1000 H=16 (a cross-check of the bounds)
      timeout 240 python3 tests/gpu/check_kernels.py --T 1000 --H 16 --out "$OUT/check_fla" | quiet | tail -16 ;;
    fla)
      # FLA's configs compiled first, one process per op and shape side by side (bench_gpu.py --compile-only:
      # nothing timed, nothing kept), so that the timed run below only benchmarks configs from the disk cache
      # (ours too, one process per shape, meanwhile). Every process appends to one
      # log (the device returns at most 8 files). `wait` names the processes: a bare `wait` also waits for
      # the `tee` behind this step's output, which never ends
      # With FLA's autotuning results seeded from AUTOTUNE_SEED (above), FLA's autotuner picks
      # from them and compiles only the chosen configs: its compile-only pass is skipped (FLA_PRECOMPILE=1
      # forces it)
      t=$(date +%s)
      pids=()
      seeded=$(find "$TRITON_CACHE_DIR" -name '*.autotune.json' | wc -l)
      for shape in B32T2K B8T8K; do
        if [ "$seeded" -eq 0 ] || [ "${FLA_PRECOMPILE:-0}" = 1 ]; then
          for op in kda_bounded kda gla delta_rule linear_attn simple_gla gated_delta_rule; do
            FLA_CACHE_RESULTS=0 timeout 200 python3 benchmarks/bench_gpu.py --compile-only --impls fla --ops "$op" \
              --shapes "$shape" --out "$OUT/fla" 2>&1 | grep -e "^compile" >>"$OUT/fla_compile.log" &
            pids+=($!)
          done
        fi
        timeout 200 python3 benchmarks/bench_gpu.py --compile-only --impls ours --shapes "$shape" --out "$OUT/fla" 2>&1 \
          | grep -e "^compile" >>"$OUT/fla_compile.log" &
        pids+=($!)
      done
      wait "${pids[@]}"
      echo "compiled in $(($(date +%s) - t)) s:"
      sort "$OUT/fla_compile.log"
      # FLA's autotuning times each config for 20 ms (Triton's default: 100), from the compiled cache
      # (and the decode step, ours against FLA's fused recurrent KDA)
      timeout 330 python3 benchmarks/bench_gpu.py --out "$OUT/fla" --impls ours fla sdpa --skip-sweep \
        --budget-s 300 --autotune-rep 20 | quiet ;;
    bench)
      timeout 120 python3 benchmarks/bench_gpu.py --out "$OUT/bench" --impls ours torch --skip-sweep --budget-s 100 \
        | quiet | tail -20 ;;
    sweep)
      # (with the settings the final step picked, if it ran)
      # shellcheck disable=SC2046
      timeout 120 python3 benchmarks/bench_gpu.py --out "$OUT/sweep" --impls ours sdpa fla --skip-decode --skip-fixed \
        --budget-s 100 --ops kda kda_bounded $(cat "$OUT/pick_set.txt" 2>/dev/null) | quiet | grep -v "^|" ;;
    packing)
      timeout 150 python3 benchmarks/sweep_packing.py --jobs 4 --out "$OUT/packing" | tail -14 ;;
    *) echo "unknown step $step (choose from: check profile fla bench sweep packing tune tune2 shapes flacheck verify final occupancy)"
      exit 2 ;;
  esac
  save_autotune
  # PACK=FILE: everything under OUT in one archive after every step (for a runner that returns few files;
  # a session cut short by its time limit keeps the steps done)
  if [ -n "${PACK:-}" ]; then tar czf "$PACK" -C "$(dirname "$OUT")" "$(basename "$OUT")"; fi
done
