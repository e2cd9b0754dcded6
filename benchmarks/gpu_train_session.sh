#!/usr/bin/env bash
# The whole-training-step measurements for one GPU machine, most important first, each under its own time
# limit. Everything is written under WORK and packed after every step into one file, OUT/session.tgz
# (checkpoints left out), so a command cut off by its time limit still returns what it measured, and a
# device that returns only a few files returns it whole:
#
#   bash benchmarks/gpu_train_session.sh OUT [STEPS]     STEPS: a subset of the names below, in any order
#
#   check    240  the GPU tests of the step (tests/gpu/test_train_step.py: no host sync between log steps,
#                 compiled = eager, each plain and with model.lean_backward; the fused softmax and SwiGLU
#                 kernels against their references; a non-finite step skipped)
#   conv      60  the short-conv kernels against their reference, and timed (tests/gpu/check_conv.py)
#   loss      60  benchmarks/bench_loss.py: the LM head + loss alone, full logits / torch / fused / FLA
#   bench    300  benchmarks/bench_train.py: every mixer, MQAR + Palindrome, T 256/1024/2048, ours (plain and
#                 lean) and FLA
#   compile  200  the same at T=1024 with torch.compile of the body beside eager
#   packing  400  benchmarks/sweep_packing.py --preset paper --jobs 3: paper-size runs packed vs serial
#   pilot    500  experiment=kimi_fig4_h200 at L=512 for 1,000 steps, lr 1e-3, 3 runs at a time
#
# The limits add up to more than one 10-minute command: name the steps that fit, e.g. "check conv loss"
# and then "bench". The first step that compiles a kernel pays Triton's compilation (about a minute for
# our kernels; FLA's layers autotune for several). Wheels the machine lacks (Hydra and its launchers;
# flash-linear-attention for the FLA rows) are installed from WHEELS (a folder of .whl files, if set) into
# WORK/site, never into the system's packages.
set -u
OUT="${1:?usage: bash benchmarks/gpu_train_session.sh OUT [STEPS]}"
STEPS="${2:-check conv loss bench compile packing pilot}"
WORK="${WORK:-${TMPDIR:-/tmp}/gpu_train_session}"
mkdir -p "$OUT" "$WORK"
if [ -n "${WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" "$WHEELS"/*.whl
  export PYTHONPATH="$WORK/site:${PYTHONPATH:-}"
fi
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$WORK/gpu.txt" 2>&1
git rev-parse --short HEAD > "$WORK/commit.txt" 2>/dev/null

pack() {
  tar czf "$OUT/session.tgz.part" -C "$WORK" --exclude='*.pt' --exclude='*.pt.tmp' --exclude='site' . \
    2>/dev/null && mv "$OUT/session.tgz.part" "$OUT/session.tgz"
}

step() {  # step NAME LIMIT COMMAND...: run one step under its limit, its log beside its results
  local name=$1 limit=$2
  shift 2
  case " $STEPS " in *" $name "*) ;; *) return ;; esac
  echo "== $name (limit ${limit}s): $*"
  timeout "$limit" "$@" > "$WORK/$name.log" 2>&1
  echo "   exit $? ($(tail -n 1 "$WORK/$name.log"))"
  # the failing tests' names on the console too, which returns even when the archive cannot
  grep -E '^(FAILED|ERROR) ' "$WORK/$name.log" | head -n 20 | sed 's/^/   /'
  pack
}

step check 240 python3 -m pytest -q -m gpu tests/gpu/test_train_step.py
step conv 60 python3 tests/gpu/check_conv.py --out "$WORK/conv"
step loss 60 python3 benchmarks/bench_loss.py --out "$WORK/loss"
step bench 300 python3 benchmarks/bench_train.py --out "$WORK/bench" --lean
step compile 200 python3 benchmarks/bench_train.py --out "$WORK/compile" --lengths 1024 --tasks mqar \
  --mixers kda gdn mamba2 attention --impls ours --compile
step packing 400 python3 benchmarks/sweep_packing.py --preset paper --jobs 3 --out "$WORK/packing"
step pilot 500 python3 train.py -m experiment=kimi_fig4_h200 hydra/launcher=joblib_gpu task.seq_len=512 \
  optim.lr=1e-3 trainer.max_steps=1000 "hydra.sweep.dir=$WORK/pilot"
pack
echo "results: $OUT/session.tgz (everything under $WORK but checkpoints)"
