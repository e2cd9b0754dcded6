#!/usr/bin/env bash
# run 95: the state passes' chained products unchained (state_fwd.unchain, state_bwd.unchain: with 8 warps and
# 64 rows Triton gave both warpgroups the same rows). Checked with nothing forced at B=8 H=16 (the many-program
# forms the B8 T8K benchmark runs: 128-column blocks, 8 warps), then profiled on / off at B8 T8K H16
set -u
W=/tmp/r95; mkdir -p $W/c $W/t
export TRITON_CACHE_DIR=/tmp/triton_cache; mkdir -p $TRITON_CACHE_DIR
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $W/gpu.txt
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a $W/gpu.txt
C=tests/gpu/check_kernels.py
q() { grep -v "Warning\|_warn_once\|^$"; }
t0=$(date +%s)
(timeout 240 python3 $C --B 8 --T 63 1000 --H 16 --no-fla --no-step --out $W/c/b8_h16 > $W/c/b8_h16.log 2>&1) &
(timeout 240 python3 $C --B 8 --T 2048 --H 16 --no-fla --no-step --ops kda_bounded kda delta_rule gla --out $W/c/b8_t2048 > $W/c/b8_t2048.log 2>&1) &
(timeout 240 python3 $C --B 8 --T 1000 --H 16 --dtype fp16 --no-fla --no-step --ops kda_bounded kda delta_rule gla gated_delta_rule --out $W/c/b8_fp16 > $W/c/b8_fp16.log 2>&1) &
wait
echo "checks took $(( $(date +%s) - t0 )) s"
for f in $W/c/*.log; do echo "== $f"; q < $f | grep -v TUNE | cut -c1-140 | tail -16; done
P() { timeout 150 python3 benchmarks/profile_gpu.py "$@" 2>&1 | q | grep -v " 0\.[0-9]%" | grep -v TUNE; }
echo "-- B8 T8K defaults (unchained where 8 warps)"
P --B 8 --T 8192 --H 16 --passes infer train --out $W/t/b8_default.csv
echo "-- B8 T8K unchain=0"
P --B 8 --T 8192 --H 16 --passes infer train --out $W/t/b8_u0.csv --set state_fwd.unchain=0 state_bwd.unchain=0
echo "total $(( $(date +%s) - t0 )) s"
tar czf $OUT/run95.tgz -C /tmp r95
