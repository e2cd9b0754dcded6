#!/usr/bin/env bash
# run 114: the bounded gate's no-grad G as uint16 decays within 16-row blocks (fwd.g16, its own cumsum kernel,
# on in the working tree, with fwd.log2, fwd.akk_bf16 and fwd.pdl): checked with nothing forced (bf16 all seven
# at B=8 H=16 T=63/1000 with the decode step, B=1 H=16 T=63/1000, H=2 T=2048/8192, fp16 and fp32 at T=1000, slow
# gates at B=8 H=16 T=1000 and H=2 T=8192), then the no-grad profile of bounded KDA at B8 T8K H16 (fwd.pdl=0,
# so that each kernel's time is its own) with g16 on and off and the new cumsum at 2 and 4 warps, and the wall
# clock of ours (bench_gpu.py) with g16 on, off, on
set -u
W=/tmp/r114; mkdir -p $W/c $W/t
export TRITON_CACHE_DIR=/tmp/triton_cache; mkdir -p $TRITON_CACHE_DIR
C=tests/gpu/check_kernels.py
q() { grep -v "Warning\|_warn_once\|^$"; }
t0=$(date +%s)
timeout 200 python3 $C --B 8 --T 63 1000 --H 16 --no-fla --out $W/c/b8_h16 > $W/c/b8_h16.log 2>&1 &
timeout 200 python3 $C --T 63 1000 --H 16 --no-fla --no-step --out $W/c/b1_h16 > $W/c/b1_h16.log 2>&1 &
timeout 200 python3 $C --T 2048 8192 --H 2 --no-fla --no-step --out $W/c/h2 > $W/c/h2.log 2>&1 &
(timeout 100 python3 $C --T 1000 --H 16 --dtype fp16 --no-fla --no-step --out $W/c/fp16 > $W/c/fp16.log 2>&1
 timeout 100 python3 $C --T 1000 --H 16 --dtype fp32 --no-fla --no-step --out $W/c/fp32 > $W/c/fp32.log 2>&1) &
(timeout 100 python3 $C --B 8 --T 1000 --H 16 --slow-gates --no-fla --no-step --out $W/c/slow_b8 > $W/c/slow_b8.log 2>&1
 timeout 100 python3 $C --T 8192 --H 2 --slow-gates --no-fla --no-step --out $W/c/slow_h2 > $W/c/slow_h2.log 2>&1) &
wait
for f in $W/c/*.log; do echo "== $f"; q < $f | grep -v TUNE | cut -c1-150 | grep "kda\|ALL\|OVER\|Error\|error" | tail -9; done
echo "checked in $(( $(date +%s) - t0 )) s"
P() { timeout 90 python3 benchmarks/profile_gpu.py --passes infer "$@" 2>&1 | q | grep -v " 0\.[0-9]%" | grep -v TUNE; }
for S in "fwd.pdl=0" "fwd.pdl=0 fwd.g16=0" "fwd.pdl=0 cumsum16.warps=2" "fwd.pdl=0 cumsum16.warps=4" "fwd.pdl=0"; do
  echo "-- $S"; P --ops kda_bounded --out "$W/t/${S// /_}.csv" --set $S
done
for g in 1 0 1; do
  echo "-- bench fwd.g16=$g"
  timeout 100 python3 benchmarks/bench_gpu.py --out $W/bench_g16_${g}_$RANDOM --impls ours --skip-sweep --skip-decode --shapes B8T8K \
    --ops kda_bounded --set fwd.g16=$g 2>&1 | grep -vi warn | grep -e "^| B8T8K | [a-z_]* | [0-9]" | head -1
done
echo "total $(( $(date +%s) - t0 )) s"
tar czf $OUT/run114.tgz -C /tmp r114
