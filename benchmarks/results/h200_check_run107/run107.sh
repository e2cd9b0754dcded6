#!/usr/bin/env bash
# run 107: intra_fwd.fold (the bounded intra forward's instruction diet): checked forced on (bf16 all seven
# at B8 H16 T=63/1000 with the decode step, B1 H16 T=63/1000, H2 T=2048/8192, fp16, fp32), then the no-grad
# forward and fwd+bwd profiled on / off at B8 T8K H16
set -u
W=/tmp/r107; mkdir -p $W/c $W/t
export TRITON_CACHE_DIR=/tmp/triton_cache; mkdir -p $TRITON_CACHE_DIR
C=tests/gpu/check_kernels.py
q() { grep -v "Warning\|_warn_once\|^$"; }
t0=$(date +%s)
S="intra_fwd.fold=1"
(timeout 200 python3 $C --B 8 --T 63 1000 --H 16 --no-fla --set $S --out $W/c/b8_h16 > $W/c/b8_h16.log 2>&1) &
(timeout 200 python3 $C --T 63 1000 --H 16 --no-fla --no-step --ops kda_bounded --set $S --out $W/c/b1_h16 > $W/c/b1_h16.log 2>&1) &
(timeout 200 python3 $C --T 2048 8192 --H 2 --no-fla --no-step --ops kda_bounded kda --set $S --out $W/c/h2 > $W/c/h2.log 2>&1) &
(timeout 100 python3 $C --T 1000 --H 16 --dtype fp16 --no-fla --no-step --ops kda_bounded --set $S --out $W/c/fp16 > $W/c/fp16.log 2>&1
 timeout 100 python3 $C --T 63 1000 --H 16 --dtype fp32 --no-fla --no-step --ops kda_bounded --set $S --out $W/c/fp32 > $W/c/fp32.log 2>&1) &
wait
echo "checks took $(( $(date +%s) - t0 )) s"
for f in $W/c/*.log; do echo "== $f"; q < $f | grep -v TUNE | cut -c1-140 | tail -10; done
P() { timeout 90 python3 benchmarks/profile_gpu.py "$@" 2>&1 | q | grep -v " 0\.[0-9]%" | grep -v TUNE; }
echo "-- defaults"; P --ops kda_bounded --passes infer train --out $W/t/default.csv
echo "-- intra_fwd.fold=1"; P --ops kda_bounded --passes infer train --out $W/t/fold.csv --set $S
echo "-- defaults again"; P --ops kda_bounded --passes infer --out $W/t/default2.csv
echo "-- intra_fwd.fold=1 again"; P --ops kda_bounded --passes infer --out $W/t/fold2.csv --set $S
echo "total $(( $(date +%s) - t0 )) s"
tar czf $OUT/run107.tgz -C /tmp r107
