#!/usr/bin/env bash
# The whole-training-step measurements in one GPU session, most important first, each under its own time
# limit, every result under OUT as soon as it exists (a session cut short keeps what it measured):
#
#   bash benchmarks/gpu_train_session.sh OUT [STEPS]     STEPS: a subset of "check conv bench compile packing pilot"
#
#   check    150  the GPU tests of the step (tests/gpu/test_train_step.py: no host sync between log steps,
#                 compiled = eager, a non-finite step skipped)
#   conv     100  the short-conv kernels against their reference, and timed (tests/gpu/check_conv.py)
#   bench    300  benchmarks/bench_train.py: every mixer, MQAR + Palindrome, T 256/1024/2048, ours and FLA
#   compile  200  the same at T=1024 with torch.compile of the body beside eager
#   packing  400  benchmarks/sweep_packing.py --preset paper --jobs 8: 8 paper-size runs packed vs serial
#   pilot    500  experiment=kimi_fig4_h200 at L=512 for 1,000 steps, all mixers and lrs (the Fig. 4 pilot)
#
# Wheels the machine lacks (Hydra and its launchers; flash-linear-attention for the FLA rows) are installed
# from WHEELS (a folder of .whl files, if set) into OUT/site, never into the system's packages.
set -u
OUT="${1:?usage: bash benchmarks/gpu_train_session.sh OUT [STEPS]}"
STEPS="${2:-check conv bench compile packing pilot}"
mkdir -p "$OUT"
if [ -n "${WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$OUT/site" "$WHEELS"/*.whl
  export PYTHONPATH="$OUT/site:${PYTHONPATH:-}"
fi
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
git rev-parse --short HEAD > "$OUT/commit.txt" 2>/dev/null

step() {  # step NAME LIMIT COMMAND...: run one step under its limit, its log beside its results
  local name=$1 limit=$2
  shift 2
  case " $STEPS " in *" $name "*) ;; *) return ;; esac
  echo "== $name (limit ${limit}s): $*"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "   exit $? ($(tail -n 1 "$OUT/$name.log"))"
}

step check 150 python -m pytest -q -m gpu tests/gpu/test_train_step.py
step conv 100 python tests/gpu/check_conv.py --out "$OUT/conv"
step bench 300 python benchmarks/bench_train.py --out "$OUT/bench"
step compile 200 python benchmarks/bench_train.py --out "$OUT/compile" --lengths 1024 --tasks mqar \
  --mixers kda gdn mamba2 attention --impls ours --compile
step packing 400 python benchmarks/sweep_packing.py --preset paper --jobs 8 --out "$OUT/packing"
step pilot 500 python train.py -m experiment=kimi_fig4_h200 hydra/launcher=joblib_gpu hydra.launcher.n_jobs=3 \
  task.seq_len=512 trainer.max_steps=1000 "hydra.sweep.dir=$OUT/pilot"
tar czf "$OUT/session.tgz" -C "$OUT" --exclude='*.pt' --exclude='session.tgz' --exclude='site' . 2>/dev/null
echo "results: $OUT (session.tgz: everything but checkpoints)"
