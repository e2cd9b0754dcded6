#!/usr/bin/env bash
# One GPU session's measurements, most important first, each step under its own time limit, every
# result written under OUT as soon as it exists (a session cut short keeps what it measured).
#
#   bash benchmarks/gpu_session.sh OUT [STEPS]        STEPS: a subset of "check profile fla bench sweep packing"
#   PACK=$OUT/run.tgz bash benchmarks/gpu_session.sh /tmp/run STEPS     (on the device tool: one archive back)
#
# Optional inputs, if present beside the checkout: .whl/ (Hydra wheels, for the packing step: built with
# `bash ../shared/device-wheels.sh .whl` on a machine with a package index) and .device/fla_core-*.whl
# (FLA 0.6.0, for the side-by-side steps: `pip download --no-deps fla-core==0.6.0 -d .device`). Both are
# installed into /tmp/site, never into the image.
#
# FLA autotunes every kernel on first use (about 200 s per op and shape on the H200, more than a session's
# device time for the whole table). Triton keeps the autotuning results on disk (FLA asks it to), so the
# script points TRITON_CACHE_DIR at /tmp/triton_cache, seeds it from benchmarks/fla_autotune/ (committed:
# run 87's results for every op at both shapes, FLA 0.6.0 with Triton 3.6.0 on the H200; a checkout
# keeps them where .device/ is lost) and .device/triton_autotune/ if present,
# and copies every *.autotune.json back to OUT/triton_autotune/ after each step. Copy that folder to
# .device/triton_autotune/ (git-ignored) and carry ".device": the next session's FLA timings then compile
# only the chosen configs instead of benchmarking all of them, and the results accumulate over sessions.
# (The cache key includes the Triton build, the GPU and FLA's source: the same device image reuses it.
# Run 17 used the results of run 15 so: FLA's sweep at H=16 needed no autotuning.)
# The device tool returns at most 8 files, two folders deep: give it PACK (one archive of OUT after
# every step), as in the second usage line.
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
# the alternative settings of the verify, tune, final and occupancy steps (comma-joined TUNE entries):
# ALT from the environment, else bwd.intra_first=0 (the backward's other order, dqk before the intra
# backward and a dG cumsum pass after it: the default for the delta rule alone since run 61) with bwd.x=1
# (the default only where the state pass has >= 256 programs of 64 columns, so the checks' small shapes
# take it only when forced)
ALT_OPS="${ALT_OPS:-kda_bounded kda gla delta_rule gated_delta_rule}"  # the ops ALT is checked and timed on
ALT="${ALT:-bwd.intra_first=0,bwd.x=1}"
OUT="${1:?usage: bash benchmarks/gpu_session.sh OUT [STEPS]}"
STEPS="${2:-check profile fla bench sweep packing}"
mkdir -p "$OUT"
wheels=$(ls .whl/*.whl .device/fla_core-*.whl 2>/dev/null)
if [ -n "$wheels" ]; then
  # shellcheck disable=SC2086
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $wheels
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
quiet() { grep -v -i "warn"; }
export TRITON_CACHE_DIR=/tmp/triton_cache
mkdir -p "$TRITON_CACHE_DIR"
for seeds in benchmarks/fla_autotune .device/triton_autotune; do
  if [ -d "$seeds" ]; then
    cp -r "$seeds/." "$TRITON_CACHE_DIR/"
    echo "seeded the Triton cache with $(find "$seeds" -name '*.autotune.json' | wc -l) autotuning results from $seeds"
  fi
done
save_autotune() {
  (cd "$TRITON_CACHE_DIR" && find . -name '*.autotune.json' | while read -r f; do
    mkdir -p "$OUT/triton_autotune/$(dirname "$f")" && cp "$f" "$OUT/triton_autotune/$f"
  done)
}
# every step's printout also goes to OUT/STEP.log: the device returns only the last 12,000 characters of
# the output, and run 11's tune profiles were lost that way
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
      # one profile per untried setting of kernels.triton.chunk.TUNE, against the default just above
      # shellcheck disable=SC2086
      timeout 70 python3 benchmarks/profile_gpu.py --ops ${TUNE_OPS:-kda_bounded kda gla delta_rule linear_attn simple_gla} \
        --passes infer train --out "$OUT/profile_tune_default.csv" | quiet | grep -v " 0\.[0-9]%" | grep -v TUNE
      # (tried on the H200 and slower there, runs 11-12: state_fwd.bv=32 state_bwd.bv=32, intra_bwd.bk=32,
      # dqk.bk=128, intra_bwd.warps=8, solve.warps=2; intra_fwd.warps=8 was 0.1 ms faster for unbounded KDA
      # only; run 16: intra_fwd.loop=1, intra_bwd.loop=1 (since removed); faster and now the defaults, runs
      # 16-18: intra_bwd.tri=1, dqk.partial_lowp=1, intra_fwd.tri=1 for the bounded gate, dqk.fused_intra=1,
      # unbounded.dense_if_safe=1; run 18, no gain and removed: W/U inside the solve kernel (solve.fused_wu,
      # with 1, 2 or 4 warps and 32 or 64 columns a step: 0.72-1.41 ms against 0.35 + 0.35 for the delta rule);
      # run 24, slower and removed: the cumsum inside the intra forward (intra_fwd.cumsum: bounded KDA's intra
      # 0.98 -> 4.07 ms), the intra backward before dqk (bwd.intra_first: bounded KDA fwd+bwd 9.25 -> 9.57);
      # run 26: the dense diagonal from the program's own tiles (intra_fwd.own, intra_bwd.own: bounded KDA's
      # intra kernels 0.98 -> 1.21 and 2.49 -> 2.93 ms; removed), L in bf16 (solve.lowp=1, now the default:
      # bounded KDA fwd+bwd 9.22 -> 9.05); run 29, slower or no gain, removed: the cumsums as 3xTF32 triangular
      # products (cumsum.dot: 0.26 -> 0.76 ms each), with them the intra backward before dqk (dqk 1.59 ->
      # 2.65), A_kk in bf16 (intra_fwd.akk_lowp: bounded KDA fwd+bwd 9.09 -> 9.10); runs 31-42: register caps and
      # stages (adopted: the caps of kernels/triton/chunk.py's TUNE comments), two 16-row blocks per intra
      # backward step and a per-chunk intra backward (both slower and removed; kernels/triton/README.md);
      # runs 44-50: the output and the no-grad W/U inside the forward state pass (state_fwd.output,
      # state_fwd.wy: adopted where the pass has many programs), with them 64-column blocks, 3 stages (out of
      # shared memory) and 4 warps (slower for KDA, 0.08 ms faster for the delta rule: the default entry);
      # runs 51-59 (benchmarks/tune_shapes.sh for tries at other shapes): bwd.x, dqk.early_w, 1 stage in the
      # per-channel intra kernels, W/U 4 warps, dvt 3 stages (adopted); state_fwd.output=0 with bwd.x,
      # state_fwd.warps=16, dqk.stages=1 or 2, intra_bwd.maxnreg=80, intra_bwd.bk=128 (slower or even);
      # runs 60-63: bwd.intra_first (adopted for the per-channel decay), state_fwd.warps=4 (adopted for the
      # no-grad pass without decay), with the intra backward first dqk at 8 warps, dqk.bk=32, dqk.stages=2,
      # intra_bwd.maxnreg=80 (slower), the cumsum in the intra forward again (0.87 -> 3.85 ms, removed),
      # intra_bwd.dg_lowp (2% faster, dg's error doubled: off); run 65: the forward state pass with 64-column
      # blocks (with 4 or 8 warps) or 1 stage (slower); run 66: the reverse state pass in 128-column blocks
      # of 8 warps with 2 stages (adopted for KDA where it has many programs), 32-column blocks (slower);
      # run 69: that form for GLA, simple GLA and linear attention (adopted; GDN slower), the intra
      # backward's partial dG in scaled fp16 (intra_bwd.dg_f16) and Vt formed from X in the backward
      # (bwd.vt_from_x): both slower for KDA and removed; run 71: dqk.bk=128 with 8 warps (2 or 3 stages;
      # slower); run 72: W from the training forward's state pass (state_fwd.w: the pass 1.09 -> 1.96 ms,
      # removed); run 73: the bounded intra forward's decayed operands from its products' exponentials
      # (intra_fwd.shared_exp, with a cap of 128 registers: 0.867 -> 0.810 ms, adopted); run 75: the cumsum in
      # the bounded intra forward a third time (0.81 -> 2.23 ms, removed); run 76: the bounded intra backward's
      # sides sharing exponentials (intra_bwd.shared_exp: 1.72 -> 1.80 ms, removed), dqk's reverse cumsum as
      # a TF32 product (dqk.cumsum_dot: 2.12 -> 2.05 ms, adopted); run 77: the forward cumsum kernel's scan
      # as a 3xTF32 product (cumsum.dot: 0.26 -> 0.76 ms, removed); run 78: a chunk's key blocks side by side
      # in launch order (dqk.k_inner: dqk 2.05 -> 1.99 ms, adopted; the intra backward's 1.73 -> 1.80), dqk's
      # row sum of k dk as a product (dqk.sum_dot: 2.05 -> 2.12 ms, removed); run 80: intra_bwd.bk=32 without
      # a cap (8 programs per SM: 1.74 -> 2.03 ms), with 2 stages (2.35), dqk.stages=2 (2.00 -> 2.06): slower;
      # run 81: cumsum.warps=2/8 (even), 16 (0.26 -> 0.39 ms), solve.warps=2 with TF32 (0.16 -> 0.25); run 82:
      # no Vt kept, formed from X in dqk and dvt (bwd.vt_x: the delta rule 4.70 -> 4.65 ms, adopted without
      # the per-channel decay; KDA's dqk +0.26 ms, as run 69); run 83: dqk's epilogue loading each tile where
      # first needed (dqk.seq: GLA's dqk 1.70 -> 1.66 ms, adopted for GLA; KDA 2.01 -> 2.03), GLA's dqk with
      # dqk.bk=128,dqk.warps=8 (1.89); run 84: d(Gamma K) = -dV S^T from dvt's dV in dqk (dqk.dv: 1.99 ->
      # 1.80 ms, adopted); run 85: state_fwd.w again (the pass 1.08 -> 1.46 ms, removed, as in run 72);
      # runs 88-89: the state passes' small inputs at the top of the chunk's step (state_fwd.early=1,
      # state_bwd.early=1: no-grad state pass 0.82 -> 0.68 ms, adopted by rule) or one chunk ahead (=2:
      # slower); run 90: the solve storing L diag(beta) (solve.beta: removed), 16 warps in the no-grad state
      # pass (3.9x slower); run 91: beta on X's rows in the WY state pass (state_fwd.beta_x: training pass
      # 1.07 -> 1.03 ms, adopted); run 93: the intra forward with 2 warps, no cap, a cap of 112, 2 stages,
      # the state pass in 64-column blocks (1 or 2 stages, 4 or 8 warps): none faster
      # entries: SETTING[,SETTING...][:OP[,OP...]] (a comma joins settings tried together; the ops it affects).
      # The default: the backward's other order again, against the defaults (TUNE_ENTRIES overrides the list)
      for entry in ${TUNE_ENTRIES:-bwd.intra_first=0:kda_bounded,kda,gla}; do
        set=${entry%%:*}
        ops=${entry#*:}
        echo "-- --set $set ($ops)"
        # shellcheck disable=SC2086
        timeout 40 python3 benchmarks/profile_gpu.py --ops ${ops//,/ } --passes infer train --set ${set//,/ } \
          --out "$OUT/profile_tune_${set//[=,]/_}.csv" | quiet | grep -v " 0\.[0-9]%" | grep -v TUNE
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
      # GPU is harmless). FLA's kernels (bf16 at H = 2 and 16) reuse the autotuning results of the fla step
      # (.device/triton_autotune), so they compile their chosen configs only
      # (issue 4's lengths: all ops at T = 2048 and 8192 with H = 2, beside T = 63 and 1000 with H = 16 below)
      timeout 200 python3 tests/gpu/check_kernels.py --T 2048 8192 --H 2 --no-step --no-fla \
        --out "$OUT/check_long" >"$OUT/check_long.txt" 2>&1 &
      pids+=($!)
      # (one process per op: run 17's single process was still compiling FLA's kernels after 110 s)
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
      cat "$OUT"/check_fla_*.txt | quiet | grep -v "^op " | grep -v "^TUNE"
      quiet <"$OUT/check_fp16.txt" | tail -5
      echo "compiled: $(grep -c compiled "$OUT/compile.log") of 28" ;;
    final)
      # the default against ALT per kernel for the ops ALT_OPS, then the benchmark (ours, SDPA) with the
      # faster of the two for the first of them, forward+backward
      # shellcheck disable=SC2086
      timeout 35 python3 benchmarks/profile_gpu.py --ops $ALT_OPS --out "$OUT/profile_default.csv" | quiet \
        | grep -v " 0\.[0-9]%" | grep -v TUNE
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
          | grep -v " 0\.[0-9]%" | grep -v TUNE
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
      # the `tee` behind this step's output, which never ends (run A hung there until its time limit)
      # With FLA's autotuning results seeded from .device/triton_autotune (above), FLA's autotuner picks
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
  # PACK=FILE: everything under OUT in one archive after every step (the device returns at most 8 files,
  # two folders deep; a session cut short by its time limit keeps the steps done)
  if [ -n "${PACK:-}" ]; then tar czf "$PACK" -C "$(dirname "$OUT")" "$(basename "$OUT")"; fi
done
