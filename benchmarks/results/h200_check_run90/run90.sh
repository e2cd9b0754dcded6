#!/usr/bin/env bash
# run 90: solve.beta (the no-grad WY forward's L diag(beta)) checked with the WY form forced, then timed;
# the no-grad state pass with 16 warps
set -u
W=/tmp/r90; mkdir -p $W/c $W/t
export TRITON_CACHE_DIR=/tmp/triton_cache
C=tests/gpu/check_kernels.py
q() { grep -v "Warning\|_warn_once\|^$"; }
t0=$(date +%s)
S="--set state_fwd.wy=1 state_fwd.output=1"
D="delta_rule gated_delta_rule kda kda_bounded"
(timeout 150 python3 $C --T 63 1000 --H 16 --no-fla --no-step --ops $D $S --out $W/c/lb_h16 > $W/c/lb_h16.log 2>&1) &
(timeout 150 python3 $C --T 2048 8192 --H 2 --no-fla --no-step --ops $D $S --out $W/c/lb_h2 > $W/c/lb_h2.log 2>&1) &
(for c in 32 16; do timeout 70 python3 $C --T 1000 --H 4 --chunk $c --no-fla --no-step --ops $D $S --out $W/c/lb_chunk$c; done > $W/c/lb_chunks.log 2>&1
 timeout 70 python3 $C --T 1000 --H 16 --dtype fp16 --no-fla --no-step --ops $D $S --out $W/c/lb_fp16 > $W/c/lb_fp16.log 2>&1) &
(timeout 100 python3 $C --T 1000 --H 16 --dtype fp32 --no-fla --no-step --ops $D $S --out $W/c/lb_fp32 > $W/c/lb_fp32.log 2>&1) &
wait
echo "checks took $(( $(date +%s) - t0 )) s"
for f in $W/c/*.log; do echo "== $f"; q < $f | grep -v TUNE | cut -c1-130 | tail -12; done
P() { timeout 120 python3 benchmarks/profile_gpu.py "$@" 2>&1 | q | grep -v " 0\.[0-9]%" | grep -v TUNE; }
for s in "solve.beta=0" "solve.beta=1" "solve.beta=1 state_fwd.warps=16" "solve.beta=0" "solve.beta=1"; do
  n=$((${n:-0} + 1)); echo "-- B8 T8K $s"; P --B 8 --T 8192 --H 16 --ops $D --passes infer --out $W/t/b8_$n.csv --set $s; done
for s in "solve.beta=0" "solve.beta=1"; do
  n=$((n + 1)); echo "-- B32 T2K $s"; P --B 32 --T 2048 --H 2 --ops $D --passes infer --out $W/t/b32_$n.csv --set $s; done
echo "total $(( $(date +%s) - t0 )) s"
tar czf $OUT/run90.tgz -C /tmp r90
