#!/usr/bin/env bash
# run 87: ours, FLA 0.6.0 and SDPA side by side at both shapes with the kernels of now (98db9c2):
# FLA's configs compiled first, one process per op and shape, then one timed run
set -u
export TRITON_CACHE_DIR=/tmp/triton_cache; mkdir -p $TRITON_CACHE_DIR
O=$OUT/r87; mkdir -p $O
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/fla_core-*.whl
export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $O/gpu.txt
python3 -c "import torch, triton, fla; print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__)" | tee -a $O/gpu.txt
t=$(date +%s)
pids=()
for s in B8T8K B32T2K; do
  for op in kda_bounded kda gla delta_rule linear_attn simple_gla gated_delta_rule; do
    FLA_CACHE_RESULTS=0 timeout 210 python3 benchmarks/bench_gpu.py --compile-only --impls fla --ops $op --shapes $s --out $O/c 2>&1 | grep -e "^compile" >>$O/compile.log &
    pids+=($!)
  done
  timeout 200 python3 benchmarks/bench_gpu.py --compile-only --impls ours --shapes $s --out $O/c 2>&1 | grep -e "^compile" >>$O/compile.log &
  pids+=($!)
done
wait "${pids[@]}"
echo "compiled in $(($(date +%s) - t)) s"; grep fla $O/compile.log | sort
rem=$((400 - ($(date +%s) - t))); echo "timed run gets $rem s"
timeout $rem python3 benchmarks/bench_gpu.py --out $O/bench --impls ours fla sdpa --skip-sweep --shapes B8T8K B32T2K \
  --budget-s $((rem - 40)) --autotune-rep 20 2>&1 | grep -vi warn | grep -e "^| B" -e "^- " | head -40
(cd $TRITON_CACHE_DIR && find . -name '*.autotune.json' | while read -r f; do mkdir -p $O/triton_autotune/$(dirname $f); cp $f $O/triton_autotune/$f; done)
tar czf $OUT/r87.tgz -C $OUT r87
echo "total $(($(date +%s) - t)) s"
