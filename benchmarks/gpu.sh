#!/usr/bin/env bash
# The run-sheet of a GPU session: checks and measurements, each step under its own time limit, its printout
# also in OUT/STEP.log, every result under OUT as soon as it exists, so that a session cut short keeps the
# steps done.
#
#   bash benchmarks/gpu.sh OUT [STEPS]             STEPS: step names below and the groups kernels (the
#                                                  default), train, compare and candidates (conv loss
#                                                  conv_step recompute_check recompute_step
#                                                  recompute_grid graphs: the forms written beside a
#                                                  default, off until timed here), in the order to run
#                                                  them
#   PACK=FILE.tgz bash benchmarks/gpu.sh OUT ...   also OUT as one archive after every step (checkpoints left
#                                                  out), for a runner that returns few files
#   REV=HEAD~3 bash benchmarks/gpu.sh OUT compare  the working tree's kernels against those of REV
#
# The kernels (group `kernels`: check profile fla bench sweep packing, about 14 minutes on an H200):
#   check      390  bf16 correctness, all ops, T=63/1000 H=16 and KDA at T=8192 H=2; fp32 and fp16 at T=1000
#   profile    150  GPU time per kernel at B8 T8K H16, the no-grad forward and fwd+bwd (speed kernels)
#   fla        570  the fixed shapes, ours, FLA and SDPA side by side (FLA's configs compiled in parallel first)
#   bench      120  the fixed shapes with the torch reference, and decode
#   sweep      120  T = 1K..64K at B=1 H=16: KDA, FLA and SDPA
#   packing    150  several small training runs packed on the GPU (sweep_packing)
#   verify     200  after a kernel change: our kernels compiled in the background (and with ALT) while the
#                   defaults (ALT on ALT_OPS), T=2048/8192, fp16 and FLA (one process per op) are checked
#   shapes     260  correctness at K, V = 64/256 and chunk sizes 32, 16
#   occupancy  150  registers, spills, shared memory, programs per SM of every launch, by the device's Triton
#   flacheck   240  FLA's kernels against the same reference, beside ours
#   tune            per-kernel profiles, TRIES="B T H|OPS|PASSES|SETTINGS;..." (SETTINGS `-`: the defaults, a
#                   comma joins several), e.g. "8 8192 16|kda_bounded delta_rule|train|state_fwd.warps=4"; 120 s a try
# The training step (group `train`; its limits add up to more than one 10-minute command):
#   train_check 240  tests/gpu/test_train_step.py: no host sync between log steps, compiled = eager, each
#                    plain and lean; the fused softmax and SwiGLU kernels; a non-finite step skipped (the
#                    CUDA-graph tests are graphs_train's)
#   conv        200  the short-conv kernels against their reference, every form of the backward (fused, two
#                    passes, looped), timed at every tile config of its sweep and the looped form's own, with
#                    the bandwidth their least traffic would take (tests/gpu/check_conv.py --sweep)
#   conv_step   600  KDA's and GDN's default step at MQAR T=1024 with the two-pass short-conv backward (the
#                    default), the looped one (rows labelled +conv-looped) and the taps as torch ops that
#                    inductor fuses (+conv-shifted), kernels listed by category
#   recompute_check 240 the same candidates compiled by inductor against the eager step: loss and gradients,
#                    KDA and GDN (tests/gpu/test_train_step.py -k recomputed; correctness only)
#   recompute_step 560  KDA's and GDN's default step at MQAR T=1024 beside the same recomputing in the
#                    backward q's and k's projections, convs and unit rows and the whole MLP, each of the
#                    two alone, and the unit q, k alone (rows +recompute-...; mixers.model RECOMPUTABLE)
#   recompute_grid 420  KDA's and GDN's Fig. 4 runs at MQAR L=1,024 for 300 steps with model.recompute [] and
#                    [qk,mlp]: step time from their logs, peak memory, first step (benchmarks.run_steps)
#   graphs      600  KDA's, Mamba2's and attention's default step at MQAR T=256 and 1,024, and the same with
#                    the compiled body replayed as CUDA graphs (rows labelled +cudagraphs; benchmarks.step)
#   graphs_train 420 the trainer's CUDA graphs (trainer.cuda_graphs=auto) against its kernel-by-kernel step,
#                    every mixer: losses, accuracies, evals at L and 2L, peak memory (tests/gpu/test_train_step.py)
#   graphs_grid 480  KDA's and Mamba2's Fig. 4 runs at Palindrome L=2,048 (evals at 2L) for 300 steps, graphs
#                    false and auto: step time from their logs, peak memory, first step (benchmarks.run_steps)
#   loss        120  the LM head + loss alone: full logits, torch, fused (two passes, and rows whole), FLA, and
#                    the default over smaller blocks of rows (whose logits L2 can hold: --block-rows)
#   step        540  every mixer's whole step, MQAR + Palindrome, T 256-2048, the default, FLA's layers where
#                    WHEELS has them: the rows of this GPU's table (benchmarks/results/h200_step/ or
#                    h100_step/) carried in and only the missing ones measured (--resume), so the table
#                    fills over sessions; FLA's autotuning configs compiled first, one process per FLA
#                    model side by side (up to 300 s; not with AUTOTUNE_SEED); T=1,024 and 2,048 first,
#                    the lengths the targets are set at; STEP_ARGS replaces the default "--variants default
#                    --lengths 1024 2048 256 512" (e.g. "--variants default eager --lengths 1024 --impls
#                    ours", or "--variants default --impls fla" for FLA's rows alone)
#   step_warm   330  FLA's configs for the missing FLA rows of that table compiled side by side, nothing timed
#                    (benchmarks.step --warm-only; WHEELS with FLA's): started detached beside a campaign
#                    training on the GPU, so that a later `step` on the same machine, with STEP_ARGS
#                    "--variants default --impls fla --no-warm", times FLA's rows at once
#   compile     200  the same at T=1024 with torch.compile of the body beside eager
#   budget      390  KDA's and GDN's default step at MQAR T=1024 beside it at trainer.compile_memory_budget 0.8
#                    (BUDGET_ARGS widens it, e.g. "--mixers kda gdn mamba2 attention --memory-budgets 0.8 0.7"),
#                    and what the compiled graph keeps (benchmarks.memory --compiled)
#   paper_packing 400  sweep_packing --preset paper --jobs 3: paper-size runs packed against serial
#   pilot       500  experiment=kimi_fig4_h200 at L=512 for 1,000 steps, lr 1e-3, 3 runs at a time
# Alone (one 10-minute command each; all into OUT/lowp): which of the chunk op's 16-bit buffers makes KDA's
# bf16 training go non-finite (benchmarks/lowp_buffers.py, Palindrome L=2048, 250 steps a variant):
#   lowp_split  420  the fp32 path, the whole 16-bit path, and every buffer it stores rounded at once on the
#                    fp32 path: the stored buffers together, or what only happens inside the kernels
#   lowp        540  the fp32 path, the whole 16-bit path, M_qk/M_kk and the partial dq/dk rounded to bf16
#   lowp_saved  540  the saved W, h, A_qk, A_kk, L rounded to bf16, one at a time
#   lowp_fwd    500  q, k into the op; the forward's A_qk and decayed Q, K, its L, its W: rounded, one at a time
#   lowp_bwd    420  the op's output o (and so dO), the reverse state pass's dVt and dh: rounded, one at a time
#   lowp_regimes 90  the op alone, fp32 and bf16, KDA and GDN, at recurring and sharp keys (lowp_regimes);
#                    the interpreter's figures of the same inputs: benchmarks/results/interp_lowp_regimes/
# Two trees (group `compare`: revcheck revbench; REV a git revision, checked out into a temporary worktree,
# or a folder holding one's tree, e.g. from `git archive REV kernels tests benchmarks | tar -x -C .rev` on a
# machine with the checkout but not its history):
#   revcheck   480  tests/gpu/check_kernels.py $CHECK_ARGS in both trees (default "--T 63 1000 --H 16 --no-fla");
#                   the script exits 1 when either is over its bounds
#   revbench   400  `speed ops $BENCH_ARGS` (default "--skip-sweep --skip-decode --impls ours") in both trees,
#                   alternately, ROUNDS (2) times; OUT/compare/compare.md: each side's median, their ratio
#
# From the environment, besides: WHEELS (.whl files or folders of them, installed --no-deps into a temporary
# folder on PYTHONPATH, never into the environment: FLA's layers for its rows, Hydra's launchers for packing;
# FLA's, about 31 MB, built here for the device's Python and carried as .whl-fla/:
#   python -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp --platform \
#     manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl-fla \
#     flash-linear-attention==0.6.0 && rm .whl-fla/numpy-* .whl-fla/kernels-*
# numpy is the image's; `kernels`, a dependency of transformers that FLA's layers do not need, shares our
# package's name);
# AUTOTUNE_SEED (Triton autotuning results, e.g. an earlier OUT/triton_autotune, copied into the cache
# first); TRITON_CACHE_DIR; ALT (KEY=VALUE,... launch settings checked, compiled and profiled beside the
# defaults by verify and occupancy) and ALT_OPS.
#
# FLA autotunes every kernel on first use (about 200 s per op and shape on an H200). Triton keeps the results
# in its cache; every *.autotune.json is copied to OUT/triton_autotune/ after each step: given as
# AUTOTUNE_SEED next time (the same image and versions), FLA compiles only the configs it chose.
set -u
usage="usage: [REV=...] [PACK=FILE] bash benchmarks/gpu.sh OUT [STEPS] (see the header)"
OUT="${1:?$usage}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
steps=()
for s in ${2:-kernels}; do
  case "$s" in
    kernels) steps+=(check profile fla bench sweep packing) ;;
    train) steps+=(train_check conv loss step compile paper_packing pilot) ;;
    compare) steps+=(revcheck revbench) ;;
    candidates) steps+=(conv loss conv_step recompute_check recompute_step recompute_grid graphs) ;;
    check|profile|fla|bench|sweep|packing|verify|shapes|occupancy|flacheck|tune|train_check|conv|loss|step|\
compile|paper_packing|pilot|lowp_split|lowp|lowp_saved|lowp_fwd|lowp_bwd|lowp_regimes|revcheck|revbench|budget|\
conv_step|recompute_step|recompute_check|recompute_grid|graphs|graphs_train|graphs_grid|step_warm) steps+=("$s") ;;
    *) echo "gpu.sh: unknown step $s; $usage" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
if [[ " ${steps[*]} " == *" tune "* ]]; then
  IFS=';' read -r -a tries <<<"${TRIES:?the tune step needs TRIES (see the header)}"
fi
if [[ " ${steps[*]} " == *" rev"* ]]; then
  REV="${REV:?the compare steps need REV (a git revision or a folder holding its tree)}"
  if [ -d "$REV" ]; then
    OLD="$(cd "$REV" && pwd)"
  else
    tmp="$(mktemp -d)"
    OLD="$tmp/rev"
    git -C "$ROOT" worktree add --detach -q "$OLD" "$REV" || {
      echo "gpu.sh: REV $REV is neither a folder nor a git revision of $ROOT (see the header)" >&2
      rm -rf "$tmp"
      exit 2
    }
    trap 'git -C "$ROOT" worktree remove --force "$OLD"; rm -rf "$tmp"' EXIT
  fi
  for f in tests/gpu/check_kernels.py kernels/triton/__init__.py; do
    [ -f "$OLD/$f" ] || { echo "gpu.sh: $OLD has no $f" >&2; exit 2; }
  done
fi

if [ -n "${WHEELS:-}" ]; then
  site=$(mktemp -d)
  wheels=()
  for w in $WHEELS; do
    if [ -d "$w" ]; then wheels+=("$w"/*.whl); else wheels+=("$w"); fi
  done
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "${wheels[@]}"
  export PYTHONPATH="$site:${PYTHONPATH:-}"
fi
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$HOME/.triton/cache}"
mkdir -p "$TRITON_CACHE_DIR"
if [ -n "${AUTOTUNE_SEED:-}" ]; then
  cp -r "$AUTOTUNE_SEED/." "$TRITON_CACHE_DIR/"
  echo "seeded the Triton cache with $(find "$AUTOTUNE_SEED" -name '*.autotune.json' | wc -l) autotuning results"
fi
cd "$ROOT" || exit 2
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "from benchmarks.common import provenance; print(provenance())"; } 2>&1 | tee "$OUT/gpu.txt"

ALT="${ALT:-}"
ALT_OPS="${ALT_OPS:-kda_bounded kda gla delta_rule gated_delta_rule}"
FAMILY=$(python3 -c "from kernels.family import OPS; print(*(op.name for op in OPS))")
quiet() { grep -v -i "warn"; }
check=(python3 tests/gpu/check_kernels.py)
speed=(python3 -m benchmarks.speed)
# brief LIMIT COMMAND...: its output in OUT/STEP.out; here its exit status, last line and failing tests
brief() {
  local limit=$1
  shift
  timeout "$limit" "$@" >"$OUT/$step.out" 2>&1
  echo "   exit $? ($(tail -n 1 "$OUT/$step.out"))"
  grep -E '^(FAILED|ERROR) ' "$OUT/$step.out" | head -n 20 | sed 's/^/   /'
}
# step_table DIR: the committed step table of this GPU's kind copied into DIR, for --resume to fill (a table
# is of one GPU: --resume refuses rows of another)
step_table() {
  local kind
  mkdir -p "$1"
  kind="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i 'h[0-9]00' | tr 'H' 'h')"
  cp "$ROOT/benchmarks/results/${kind:-none}_step/"bench_train* "$1/" 2>/dev/null
}
# fig4_forms DIR LIMIT OVERRIDES KEY NAME:VALUE...: Fig. 4's runs of OVERRIDES (lr 1e-3, 300 steps), once
# for each VALUE of KEY, into DIR/NAME (no comma in NAME: -m would sweep over its parts); then their step times, peak memory and first steps from their logs
# and summaries (benchmarks.run_steps), the checkpoints deleted
fig4_forms() {
  local dir=$1 limit=$2 overrides=$3 key=$4
  shift 4
  for form in "$@"; do
    # shellcheck disable=SC2086
    brief "$limit" python3 train.py -m experiment=kimi_fig4_h200 hydra/launcher=joblib_gpu hydra.launcher.n_jobs=1 \
      $overrides optim.lr=1e-3 trainer.max_steps=300 "$key=${form#*:}" "hydra.sweep.dir=$dir/${form%%:*}"
  done
  find "$dir" -name '*.pt' -delete
  brief 60 python3 -m benchmarks.run_steps "$dir" --out "$dir"
}
# checked LIMIT NAME LINES ARGS...: one part of the check step, its last LINES lines shown; a part over its
# bounds, or stopped at its limit (the kernels compiled cold, or beside a training run), fails the sheet
# and says so, as its table then stops short of its verdict line
checked() {
  local limit=$1 name=$2 lines=$3
  shift 3
  timeout "$limit" "${check[@]}" "$@" --out "$OUT/check_$name" | quiet | tail -n "$lines"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 124 ]; then
    echo "check_$name INCOMPLETE: stopped at its $limit s limit; only the rows above were checked"
  elif [ "$rc" -ne 0 ]; then
    echo "check_$name FAILED: exit $rc"
  fi
  [ "$rc" -eq 0 ] || status=1
}
side() { if [ "$1" = "$ROOT" ]; then echo tree; else echo rev; fi; }
status=0
exec 3>&1
for step in "${steps[@]}"; do
  exec > >(tee -a "$OUT/$step.log" >&3) 2>&1
  echo "== $step ($(date -u +%H:%M:%S))"
  case "$step" in
    check)
      checked 150 bf16 30 --T 63 1000 --H 16 --no-fla
      checked 60 long 6 --T 8192 --H 2 --ops kda kda_bounded
      for d in fp32 fp16; do
        checked 90 $d 8 --T 1000 --H 16 --ops kda_bounded gla delta_rule --dtype $d
      done ;;
    profile)
      timeout 150 "${speed[@]}" kernels --out "$OUT/profile.csv" | quiet | grep -v " 0\.[0-9]%" ;;
    fla)
      # FLA's configs compiled first, one process per op and shape side by side (`ops --compile-only`:
      # nothing timed, nothing kept), ours meanwhile, one process per shape, so that the timed run only
      # benchmarks configs from the disk cache; skipped for FLA where AUTOTUNE_SEED gave its choices
      # (FLA_PRECOMPILE=1 forces it). `wait` names the processes: a bare one also waits for this step's tee
      t=$(date +%s)
      pids=()
      seeded=$(find "$TRITON_CACHE_DIR" -name '*.autotune.json' | wc -l)
      for shape in B32T2K B8T8K; do
        if [ "$seeded" -eq 0 ] || [ "${FLA_PRECOMPILE:-0}" = 1 ]; then
          for op in $FAMILY; do
            FLA_CACHE_RESULTS=0 timeout 200 "${speed[@]}" ops --compile-only --impls fla --ops "$op" --shapes "$shape" \
              --out "$OUT/fla" 2>&1 | grep -e "^compile" >>"$OUT/fla_compile.log" &
            pids+=($!)
          done
        fi
        timeout 200 "${speed[@]}" ops --compile-only --impls ours --shapes "$shape" --out "$OUT/fla" 2>&1 \
          | grep -e "^compile" >>"$OUT/fla_compile.log" &
        pids+=($!)
      done
      wait "${pids[@]}"
      echo "compiled in $(($(date +%s) - t)) s:"
      sort "$OUT/fla_compile.log"
      # FLA's autotuning times each config for 20 ms (Triton's default: 100), from the compiled cache
      timeout 330 "${speed[@]}" ops --out "$OUT/fla" --impls ours fla sdpa --skip-sweep --budget-s 300 --autotune-rep 20 \
        | quiet ;;
    bench)
      timeout 120 "${speed[@]}" ops --out "$OUT/bench" --impls ours torch --skip-sweep --budget-s 100 | quiet | tail -20 ;;
    sweep)
      timeout 120 "${speed[@]}" ops --out "$OUT/sweep" --impls ours sdpa fla --skip-decode --skip-fixed --budget-s 100 \
        --ops kda kda_bounded | quiet | grep -v "^|" ;;
    packing)
      timeout 150 python3 -m benchmarks.sweep_packing --jobs 4 --out "$OUT/packing" | tail -14 ;;
    verify)
      # our kernels for the benchmark shapes compile in the background (also with ALT) while the checks
      # run: sharing the GPU is harmless to correctness. FLA's kernels reuse the autotuning results of
      # AUTOTUNE_SEED, one process per op (one process compiles them one op after the other); simple GLA's
      # and the gated delta rule's: forward only, their backward refuses Triton 3.6 (#640)
      pids=()
      for shape in B32T2K B8T8K; do
        for set in - ${ALT:+"$ALT"}; do
          # shellcheck disable=SC2046
          timeout 110 "${speed[@]}" ops --compile-only --impls ours --shapes "$shape" --out "$OUT/bench" \
            $([ "$set" = - ] || echo --set "${set//,/ }") 2>&1 | grep -e "^compile" >>"$OUT/compile.log" &
          pids+=($!)
        done
      done
      timeout 200 "${check[@]}" --T 2048 8192 --H 2 --no-step --no-fla --out "$OUT/check_long" >"$OUT/check_long.txt" 2>&1 &
      pids+=($!)
      for op in $FAMILY; do
        timeout 200 "${check[@]}" --T 1000 --H 16 --ops "$op" --no-step --out "$OUT/check_fla_$op" \
          >"$OUT/check_fla_$op.txt" 2>&1 &
        pids+=($!)
      done
      timeout 110 "${check[@]}" --T 1000 --H 16 --ops kda_bounded gla delta_rule --dtype fp16 --no-step --no-fla \
        --out "$OUT/check_fp16" >"$OUT/check_fp16.txt" 2>&1 &
      pids+=($!)
      timeout 100 "${check[@]}" --T 63 1000 --H 16 --no-fla --out "$OUT/check_bf16" | quiet | tail -17
      if [ -n "$ALT" ]; then
        # shellcheck disable=SC2086
        timeout 50 "${check[@]}" --T 63 1000 --H 16 --no-fla --no-step --ops $ALT_OPS --set ${ALT//,/ } \
          --out "$OUT/check_alt" | quiet | tail -8
      fi
      wait "${pids[@]}"
      quiet <"$OUT/check_long.txt" | tail -16
      cat "$OUT"/check_fla_*.txt | quiet | grep -v "^op " | grep -v "^settings"
      quiet <"$OUT/check_fp16.txt" | tail -5
      echo "compiled: $(grep -c compiled "$OUT/compile.log")" ;;
    shapes)
      for kv in "64 64" "256 256" "64 128"; do
        read -r K V <<<"$kv"
        timeout 60 "${check[@]}" --T 1000 --H 4 --K "$K" --V "$V" --no-fla --no-step \
          --ops kda_bounded kda gla delta_rule linear_attn --out "$OUT/check_k${K}_v$V" | quiet | tail -7
      done
      for c in 32 16; do
        timeout 40 "${check[@]}" --T 1000 --H 4 --chunk $c --no-fla --no-step --ops kda_bounded kda gated_delta_rule \
          --out "$OUT/check_chunk$c" | quiet | tail -5
      done ;;
    occupancy)
      timeout 70 python3 -m benchmarks.launches occupancy --ops kda_bounded kda gla delta_rule \
        --out "$OUT/occupancy.csv" | quiet
      if [ -n "$ALT" ]; then
        # shellcheck disable=SC2086
        timeout 70 python3 -m benchmarks.launches occupancy --ops kda_bounded delta_rule --set ${ALT//,/ } \
          --out "$OUT/occupancy_alt.csv" | quiet | grep -e "^#" -e intra
      fi ;;
    flacheck)
      timeout 240 "${check[@]}" --T 1000 --H 16 --out "$OUT/check_fla" | quiet | tail -16 ;;
    tune)
      for n in "${!tries[@]}"; do
        IFS='|' read -r shape ops passes settings <<<"${tries[$n]}"
        read -r B T H <<<"$shape"
        echo "-- try $n: B$B T$T H$H ops=[$ops] passes=[$passes] set=[$settings]"
        set_args=()
        # shellcheck disable=SC2206
        [ "$settings" = - ] || set_args=(--set ${settings//,/ })
        # shellcheck disable=SC2086
        timeout 120 "${speed[@]}" kernels --B "$B" --T "$T" --H "$H" --ops $ops --passes $passes \
          --out "$OUT/tune_$n.csv" "${set_args[@]}" 2>&1 | grep -v "Warning\|_warn_once\|^$" | grep -v " 0\.[0-9]%"
      done ;;
    train_check)
      # the CUDA-graph tests (seven minutes) are graphs_train's
      brief 240 python3 -m pytest -q -m gpu tests/gpu/test_train_step.py -k "not cuda_graphs" ;;
    recompute_check)
      brief 240 python3 -m pytest -q -m gpu tests/gpu/test_train_step.py -k recomputed -p no:logging ;;
    conv)
      brief 200 python3 tests/gpu/check_conv.py --out "$OUT/conv" --sweep ;;
    conv_step)
      for form in "--conv-bwd two_pass" "--conv-bwd looped" "--conv-impl shifted"; do
        # shellcheck disable=SC2086
        brief 200 python3 -m benchmarks.step --out "$OUT/conv_step" --resume --lengths 1024 --tasks mqar \
          --impls ours --variants default --mixers kda gdn $form
      done ;;
    graphs)
      # the default step and the same with its compiled body replayed as CUDA graphs, into one table
      for flag in "" --cuda-graphs; do
        # shellcheck disable=SC2086
        brief 300 python3 -m benchmarks.step --out "$OUT/graphs" --resume --lengths 256 1024 --tasks mqar \
          --impls ours --variants default --mixers kda mamba2 attention $flag
      done ;;
    recompute_step)
      for form in "" "--recompute qk mlp" "--recompute qk" "--recompute mlp" "--recompute qk_norm"; do
        # shellcheck disable=SC2086
        brief 110 python3 -m benchmarks.step --out "$OUT/recompute_step" --resume --lengths 1024 \
          --tasks mqar --impls ours --variants default --mixers kda gdn $form
      done ;;
    recompute_grid)
      fig4_forms "$OUT/recompute_grid" 200 "task=mqar task.seq_len=1024 mixer=kda,gdn" model.recompute \
        "none:[]" "qk+mlp:[qk,mlp]" ;;
    graphs_train)
      brief 420 python3 -m pytest -q -m gpu tests/gpu/test_train_step.py -k cuda_graphs -p no:logging ;;
    graphs_grid)
      fig4_forms "$OUT/graphs_grid" 220 "task=palindrome task.seq_len=2048 mixer=kda,mamba2" \
        trainer.cuda_graphs false:false auto:auto ;;
    loss)
      brief 120 "${speed[@]}" loss --out "$OUT/loss" --block-rows 1024 2048 4096 8192 ;;
    step)
      step_table "$OUT/step"
      # a seeded cache holds FLA's autotuning choices: nothing for the side-by-side compiles to save
      warm=""; [ -n "${AUTOTUNE_SEED:-}" ] && warm="--no-warm"
      # shellcheck disable=SC2086
      brief 540 python3 -m benchmarks.step --out "$OUT/step" --resume $warm ${STEP_ARGS:---variants default --lengths 1024 2048 256 512} ;;
    step_warm)
      step_table "$OUT/step"
      # shellcheck disable=SC2086
      brief 330 python3 -m benchmarks.step --out "$OUT/step" --resume --warm-only \
        ${STEP_ARGS:---variants default --impls fla} ;;
    compile)
      brief 200 python3 -m benchmarks.step --out "$OUT/compile" --lengths 1024 --tasks mqar \
        --mixers kda gdn mamba2 attention --impls ours --compile ;;
    budget)
      # shellcheck disable=SC2086
      brief 300 python3 -m benchmarks.step --out "$OUT/budget" --lengths 1024 --tasks mqar --impls ours \
        --variants default ${BUDGET_ARGS:---mixers kda gdn --memory-budgets 0.8}
      cp "$OUT/$step.out" "$OUT/budget/step.out"
      # tracing both mixers' graphs cold can take more than half a minute
      brief 90 python3 -m benchmarks.memory --device cuda --plain --compiled --mixers kda gdn
      cp "$OUT/$step.out" "$OUT/budget/compiled_saved.md" ;;
    paper_packing)
      brief 400 python3 -m benchmarks.sweep_packing --preset paper --jobs 3 --out "$OUT/paper_packing" ;;
    pilot)
      brief 500 python3 train.py -m experiment=kimi_fig4_h200 hydra/launcher=joblib_gpu task.seq_len=512 \
        optim.lr=1e-3 trainer.max_steps=1000 "hydra.sweep.dir=$OUT/pilot"
      find "$OUT/pilot" -name '*.pt' -delete ;;  # checkpoints: the summaries and metrics are the result
    lowp_split)
      brief 420 python3 -m benchmarks.lowp_buffers --out "$OUT/lowp" --variants fp32 bf16_all rounded ;;
    lowp)
      brief 540 python3 -m benchmarks.lowp_buffers --out "$OUT/lowp" --variants fp32 bf16_all m partial ;;
    lowp_saved)
      brief 540 python3 -m benchmarks.lowp_buffers --out "$OUT/lowp" \
        --variants saved_w saved_h saved_aqk saved_akk saved_linv ;;
    lowp_fwd)
      brief 500 python3 -m benchmarks.lowp_buffers --out "$OUT/lowp" --variants inputs fwd_intra fwd_linv fwd_wu ;;
    lowp_regimes)
      brief 90 python3 -m benchmarks.lowp_regimes --out "$OUT/lowp" ;;
    lowp_bwd)
      brief 420 python3 -m benchmarks.lowp_buffers --out "$OUT/lowp" --variants output bwd_dvt bwd_dh ;;
    revcheck)
      for tree in "$OLD" "$ROOT"; do
        dir="$OUT/compare/$(side "$tree")"
        mkdir -p "$dir"
        # shellcheck disable=SC2086
        (cd "$tree" && timeout 240 python3 tests/gpu/check_kernels.py ${CHECK_ARGS:---T 63 1000 --H 16 --no-fla} \
          --out "$dir/check") >"$dir/check.log" 2>&1
        rc=$?
        echo "check, $(side "$tree"): exit $rc, $(tail -n 1 "$dir/check.log")"
        [ $rc -eq 0 ] || status=1
      done ;;
    revbench)
      for round in $(seq 1 "${ROUNDS:-2}"); do
        for tree in "$OLD" "$ROOT"; do
          dir="$OUT/compare/$(side "$tree")"
          mkdir -p "$dir"
          # the tree's own ops benchmark, in the layout it has
          ops=(python3 benchmarks/bench_gpu.py)
          [ -f "$tree/benchmarks/speed.py" ] && ops=("${speed[@]}" ops)
          # shellcheck disable=SC2086
          (cd "$tree" && timeout 200 "${ops[@]}" ${BENCH_ARGS:---skip-sweep --skip-decode --impls ours} \
            --out "$dir/bench_$round") >"$dir/bench_$round.log" 2>&1
          echo "bench round $round, $(side "$tree"): exit $?"
        done
      done
      "${speed[@]}" compare "$OUT/compare" "$REV" | tee "$OUT/compare/compare.md" ;;
  esac
  (cd "$TRITON_CACHE_DIR" && find . -name '*.autotune.json' | while read -r f; do
    mkdir -p "$OUT/triton_autotune/$(dirname "$f")" && cp "$f" "$OUT/triton_autotune/$f"
  done)
  if [ -n "${PACK:-}" ]; then
    tar czf "$PACK.part" -C "$OUT" --exclude='*.pt' --exclude='*.pt.tmp' --exclude="$(basename "$PACK")*" . \
      && mv "$PACK.part" "$PACK"
  fi
done
exit $status
