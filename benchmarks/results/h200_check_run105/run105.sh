#!/usr/bin/env bash
# run 105: the per-channel cumsum and intra forward in one launch (fwd.cumsum_fused = chunks a round; off by
# default): checked forced on (bf16 all seven at B8 H16 T=63/1000, H2 T=8192, fp16, fp32), then the no-grad
# forward and fwd+bwd profiled against the defaults at B8 T8K H16 for a few round sizes
set -u
W=/tmp/r105; mkdir -p $W/c $W/t
export TRITON_CACHE_DIR=/tmp/triton_cache; mkdir -p $TRITON_CACHE_DIR
C=tests/gpu/check_kernels.py
q() { grep -v "Warning\|_warn_once\|^$"; }
t0=$(date +%s)
S="fwd.cumsum_fused=132"
D="kda_bounded kda gla"
(timeout 150 python3 $C --B 8 --T 63 1000 --H 16 --no-fla --set $S --out $W/c/b8_h16 > $W/c/b8_h16.log 2>&1) &
(timeout 150 python3 $C --T 8192 --H 2 --no-fla --no-step --ops $D --set $S --out $W/c/h2 > $W/c/h2.log 2>&1) &
(timeout 150 python3 $C --T 1000 --H 16 --dtype fp16 --no-fla --no-step --ops $D --set $S --out $W/c/fp16 > $W/c/fp16.log 2>&1) &
(timeout 150 python3 $C --T 63 1000 --H 16 --dtype fp32 --no-fla --no-step --ops $D --set $S --out $W/c/fp32 > $W/c/fp32.log 2>&1) &
wait
echo "checks took $(( $(date +%s) - t0 )) s"
for f in $W/c/*.log; do echo "== $f"; q < $f | grep -v TUNE | cut -c1-140 | tail -9; done
P() { timeout 90 python3 benchmarks/profile_gpu.py "$@" 2>&1 | q | grep -v " 0\.[0-9]%" | grep -v TUNE; }
echo "-- defaults"; P --ops kda_bounded kda gla --passes infer train --out $W/t/default.csv
for G in 33 132 528; do
  echo "-- fwd.cumsum_fused=$G"; P --ops kda_bounded kda --passes infer train --out $W/t/fused$G.csv --set fwd.cumsum_fused=$G
done
echo "-- gla fwd.cumsum_fused=132, 2 and 4 warps"; P --ops gla --passes infer --out $W/t/gla2.csv --set fwd.cumsum_fused=132
P --ops gla --passes infer --out $W/t/gla4.csv --set fwd.cumsum_fused=132 intra_fwd.warps=4
echo "total $(( $(date +%s) - t0 )) s"
tar czf $OUT/run105.tgz -C /tmp r105
