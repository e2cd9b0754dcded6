#!/usr/bin/env bash
# run 94: the committed defaults (commit 83ede50's kernels = 3dc8a19's), nothing forced: bf16 all seven at
# T=63/1000 H16 with the decode step and T=2048/8192 H2, fp16 and fp32 at T=1000 H16
set -u
W=/tmp/r94; mkdir -p $W
export TRITON_CACHE_DIR=/tmp/triton_cache
C=tests/gpu/check_kernels.py
q() { grep -v "Warning\|_warn_once\|^$\|TUNE"; }
t0=$(date +%s)
(timeout 200 python3 $C --T 63 1000 --H 16 --no-fla --out $W/bf16_h16 > $W/bf16_h16.log 2>&1) &
(timeout 200 python3 $C --T 2048 8192 --H 2 --no-fla --no-step --out $W/bf16_h2 > $W/bf16_h2.log 2>&1) &
(timeout 200 python3 $C --T 1000 --H 16 --dtype fp16 --no-fla --no-step --out $W/fp16 > $W/fp16.log 2>&1) &
(timeout 200 python3 $C --T 1000 --H 16 --dtype fp32 --no-fla --no-step --out $W/fp32 > $W/fp32.log 2>&1) &
wait
for f in $W/*.log; do echo "== $f"; q < $f | cut -c1-130 | tail -16; done
echo "total $(( $(date +%s) - t0 )) s"
tar czf $OUT/run94.tgz -C /tmp r94
