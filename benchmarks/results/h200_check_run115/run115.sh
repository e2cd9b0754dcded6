#!/usr/bin/env bash
# run 115: the kernels of commit a3f73c3 (run 110's with fwd.log2, fwd.akk_bf16, fwd.pdl and fwd.g16), checked
# with nothing forced while FLA compiles (bf16 all seven at B=8 H=16 T=63/1000 with the decode step, B=1 H=16
# T=63/1000, H=2 T=2048/8192; fp16 and fp32 at T=1000; slow gates at B=8 H=16 T=1000), then ours, FLA 0.6.0 and
# SDPA side by side at both shapes with the decode step, the B=1 length sweep (ours, SDPA) for both KDAs, and
# the no-grad forward's GPU time (plain launches, as profile_gpu.py runs them)
set -u
W=/tmp/r115; mkdir -p $W
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
# meanwhile (nothing is timed while compiling): the checks
C=tests/gpu/check_kernels.py
mkdir -p $W/check
timeout 200 python3 $C --B 8 --T 63 1000 --H 16 --no-fla --out $W/check/b8_h16 > $W/check/b8_h16.log 2>&1 &
pids+=($!)
timeout 200 python3 $C --T 63 1000 --H 16 --no-fla --no-step --out $W/check/b1_h16 > $W/check/b1_h16.log 2>&1 &
pids+=($!)
timeout 200 python3 $C --T 2048 8192 --H 2 --no-fla --no-step --out $W/check/h2 > $W/check/h2.log 2>&1 &
pids+=($!)
(timeout 100 python3 $C --T 1000 --H 16 --dtype fp16 --no-fla --no-step --out $W/check/fp16 > $W/check/fp16.log 2>&1
 timeout 100 python3 $C --T 1000 --H 16 --dtype fp32 --no-fla --no-step --out $W/check/fp32 > $W/check/fp32.log 2>&1
 timeout 60 python3 $C --B 8 --T 1000 --H 16 --slow-gates --no-fla --no-step --out $W/check/slow > $W/check/slow.log 2>&1) &
pids+=($!)
wait "${pids[@]}"
for f in $W/check/*.log; do echo "== $f"; grep -v "Warning\|_warn_once\|^$\|TUNE" $f | cut -c1-140 | tail -17; done
echo "compiled in $(($(date +%s) - t)) s"; sort $W/compile.log | tail -30
rem=$((370 - ($(date +%s) - t))); echo "timed run gets $rem s"
timeout $rem python3 benchmarks/bench_gpu.py --out $W/bench --impls ours fla sdpa --skip-sweep --shapes B8T8K B32T2K \
  --budget-s $((rem - 30)) --autotune-rep 20 2>&1 | grep -vi warn | grep -e "^| B" -e "^- " -e "decode" | head -60
rem=$((430 - ($(date +%s) - t))); echo "sweep gets $rem s"
[ $rem -gt 40 ] && timeout $rem python3 benchmarks/bench_gpu.py --out $W/sweep --impls ours sdpa --skip-decode --skip-fixed \
  --budget-s $((rem - 20)) --ops kda kda_bounded 2>&1 | grep -vi warn | grep -v "^|" | tail -3
timeout 60 python3 benchmarks/profile_gpu.py --passes infer --ops kda_bounded kda gla delta_rule gated_delta_rule \
  --out $W/profile_infer.csv 2>&1 | grep -v "Warning\|_warn_once\|^$\|TUNE" | grep -v " 0\.[0-9]%"
echo "total $(($(date +%s) - t)) s"
tar czf $OUT/run115.tgz -C /tmp r115
