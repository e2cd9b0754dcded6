#!/usr/bin/env bash
# run 102: the bounded gate's intra forward with each block of A_qk and A_kk from one product of the stacked
# [q; k] rows (intra_fwd.joint, on by default: sm_90 HMMA 64 -> 16 a thread, the loop body 332 -> 250
# instructions, 48 -> 0 bytes spilled), checked (bf16 B8 H16 T=63/1000, H2 T=8192, fp16, fp32), then timed both ways
set -u
W=/tmp/r102; mkdir -p $W/c $W/t
export TRITON_CACHE_DIR=/tmp/triton_cache; mkdir -p $TRITON_CACHE_DIR
C=tests/gpu/check_kernels.py
q() { grep -v "Warning\|_warn_once\|^$"; }
t0=$(date +%s)
(timeout 150 python3 $C --B 8 --T 63 1000 --H 16 --no-fla --no-step --ops kda_bounded --out $W/c/b8_h16 > $W/c/b8_h16.log 2>&1) &
(timeout 150 python3 $C --T 63 8192 --H 2 --no-fla --no-step --ops kda_bounded --out $W/c/h2 > $W/c/h2.log 2>&1) &
(timeout 150 python3 $C --T 1000 --H 16 --dtype fp16 --no-fla --no-step --ops kda_bounded --out $W/c/fp16 > $W/c/fp16.log 2>&1) &
(timeout 150 python3 $C --T 100 1000 --H 16 --dtype fp32 --no-fla --no-step --ops kda_bounded --out $W/c/fp32 > $W/c/fp32.log 2>&1) &
wait
echo "checks took $(( $(date +%s) - t0 )) s"
for f in $W/c/*.log; do echo "== $f"; q < $f | grep -v TUNE | cut -c1-140 | tail -4; done
P() { timeout 100 python3 benchmarks/profile_gpu.py "$@" 2>&1 | q | grep -v " 0\.[0-9]%" | grep -v TUNE; }
echo "-- joint (default)"; P --ops kda_bounded --passes infer train --out $W/t/joint1.csv
echo "-- joint=0"; P --ops kda_bounded --passes infer train --out $W/t/joint0.csv --set intra_fwd.joint=0
echo "-- joint (default) again"; P --ops kda_bounded --passes infer --out $W/t/joint1b.csv
echo "total $(( $(date +%s) - t0 )) s"
tar czf $OUT/run102.tgz -C /tmp r102
