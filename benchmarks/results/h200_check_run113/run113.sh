#!/usr/bin/env bash
# run 113: the forward's four kernels as programmatic dependent launches (fwd.pdl, on in the working tree):
# checked with nothing forced (bf16 all seven at B=8 H=16 T=63/1000 with the decode step, H=2 T=8192, slow gates
# at B=8 H=16 T=1000, fp16 at T=1000), then the wall clock of ours at B8 T8K (bench_gpu.py) with fwd.pdl 1, 0, 1
# and the no-grad profile of bounded KDA with it on
set -u
W=/tmp/r113; mkdir -p $W/c $W/t
export TRITON_CACHE_DIR=/tmp/triton_cache; mkdir -p $TRITON_CACHE_DIR
C=tests/gpu/check_kernels.py
q() { grep -v "Warning\|_warn_once\|^$"; }
t0=$(date +%s)
timeout 200 python3 $C --B 8 --T 63 1000 --H 16 --no-fla --out $W/c/b8_h16 > $W/c/b8_h16.log 2>&1 &
timeout 200 python3 $C --T 8192 --H 2 --no-fla --no-step --out $W/c/h2 > $W/c/h2.log 2>&1 &
timeout 200 python3 $C --B 8 --T 1000 --H 16 --slow-gates --no-fla --no-step --out $W/c/slow_b8 > $W/c/slow_b8.log 2>&1 &
timeout 200 python3 $C --T 1000 --H 16 --dtype fp16 --no-fla --no-step --out $W/c/fp16 > $W/c/fp16.log 2>&1 &
wait
for f in $W/c/*.log; do echo "== $f"; q < $f | grep -v TUNE | cut -c1-150 | tail -17; done
echo "checked in $(( $(date +%s) - t0 )) s"
for i in 1 2 3; do
  p=$(( i % 2 ))
  echo "-- bench fwd.pdl=$p"
  timeout 150 python3 benchmarks/bench_gpu.py --out $W/bench_pdl${p}_$i --impls ours --skip-sweep --skip-decode --shapes B8T8K \
    --ops kda_bounded kda gla delta_rule gated_delta_rule --set fwd.pdl=$p 2>&1 | grep -vi warn | grep -e "^| B8T8K | [a-z_]* | [0-9]" | head
done
P() { timeout 90 python3 benchmarks/profile_gpu.py --passes infer "$@" 2>&1 | q | grep -v " 0\.[0-9]%" | grep -v TUNE; }
echo "-- profile, defaults"; P --ops kda_bounded --out $W/t/default.csv
echo "total $(( $(date +%s) - t0 )) s"
tar czf $OUT/run113.tgz -C /tmp r113
