#!/usr/bin/env bash
# run 92: ours (state passes' small inputs early, beta on X's rows), FLA 0.6.0 and SDPA side by side at both
# shapes with the decode step, then the B=1 length sweep (ours, SDPA) for both KDAs with the time left
set -u
W=/tmp/r92; mkdir -p $W
export TRITON_CACHE_DIR=/tmp/triton_cache; mkdir -p $TRITON_CACHE_DIR
for s in benchmarks/fla_autotune .device/triton_autotune; do [ -d $s ] && cp -r $s/. $TRITON_CACHE_DIR/; done
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/fla_core-*.whl
export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $W/gpu.txt
python3 -c "import torch, triton, fla; print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__)" | tee -a $W/gpu.txt
t=$(date +%s)
pids=()
for s in B8T8K B32T2K; do
  timeout 200 python3 benchmarks/bench_gpu.py --compile-only --impls fla --shapes $s --out $W/c 2>&1 | grep -e "^compile" >> $W/compile.log &
  pids+=($!)
  timeout 200 python3 benchmarks/bench_gpu.py --compile-only --impls ours --shapes $s --out $W/c 2>&1 | grep -e "^compile" >> $W/compile.log &
  pids+=($!)
done
# meanwhile (nothing is timed while compiling): the wide training forward's form as B8 T8K runs it for KDA
# (WY with bwd.x, beta on X's rows, the small inputs where used) checked at the checks' small B*H
timeout 150 python3 tests/gpu/check_kernels.py --T 63 1000 --H 16 --no-fla --no-step --ops kda kda_bounded delta_rule gla \
  --set state_fwd.output=1 bwd.x=1 state_fwd.early=0 state_bwd.early=0 --out $W/check_wide > $W/check_wide.log 2>&1 &
pids+=($!)
wait "${pids[@]}"
grep -v "Warning\|_warn_once\|^$\|TUNE" $W/check_wide.log | cut -c1-130 | tail -10
echo "compiled in $(($(date +%s) - t)) s"; sort $W/compile.log | tail -30
rem=$((330 - ($(date +%s) - t))); echo "timed run gets $rem s"
timeout $rem python3 benchmarks/bench_gpu.py --out $W/bench --impls ours fla sdpa --skip-sweep --shapes B8T8K B32T2K \
  --budget-s $((rem - 30)) --autotune-rep 20 2>&1 | grep -vi warn | grep -e "^| B" -e "^- " -e "decode" | head -60
rem=$((500 - ($(date +%s) - t))); echo "sweep gets $rem s"
[ $rem -gt 40 ] && timeout $rem python3 benchmarks/bench_gpu.py --out $W/sweep --impls ours sdpa --skip-decode --skip-fixed \
  --budget-s $((rem - 20)) --ops kda kda_bounded 2>&1 | grep -vi warn | grep -v "^|" | tail -3
echo "total $(($(date +%s) - t)) s"
tar czf $OUT/run92.tgz -C /tmp r92
