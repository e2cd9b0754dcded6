#!/usr/bin/env bash
# run 103: two no-grad forward alternatives, off by default: the state pass forming the per-channel decayed
# operands itself (state_fwd.decay_in) and L, A_qk without their upper zeros (fwd.tril): checked forced on
# (bf16 B8 H16 T=63/1000, fp16, fp32), then the no-grad forward profiled against the defaults
set -u
W=/tmp/r103; mkdir -p $W/c $W/t
export TRITON_CACHE_DIR=/tmp/triton_cache; mkdir -p $TRITON_CACHE_DIR
C=tests/gpu/check_kernels.py
q() { grep -v "Warning\|_warn_once\|^$"; }
t0=$(date +%s)
S="state_fwd.decay_in=1 fwd.tril=1"
D="kda_bounded kda gla delta_rule gated_delta_rule"
(timeout 200 python3 $C --B 8 --T 63 1000 --H 16 --no-fla --no-step --set $S --out $W/c/b8_h16 > $W/c/b8_h16.log 2>&1) &
(timeout 200 python3 $C --T 8192 --H 2 --no-fla --no-step --ops $D --set $S --out $W/c/h2 > $W/c/h2.log 2>&1) &
(timeout 200 python3 $C --T 1000 --H 16 --dtype fp16 --no-fla --no-step --ops $D --set $S --out $W/c/fp16 > $W/c/fp16.log 2>&1) &
(timeout 200 python3 $C --T 63 1000 --H 16 --dtype fp32 --no-fla --no-step --ops kda_bounded kda gla --set $S --out $W/c/fp32 > $W/c/fp32.log 2>&1) &
wait
echo "checks took $(( $(date +%s) - t0 )) s"
for f in $W/c/*.log; do echo "== $f"; q < $f | grep -v TUNE | cut -c1-140 | tail -11; done
P() { timeout 100 python3 benchmarks/profile_gpu.py --passes infer "$@" 2>&1 | q | grep -v " 0\.[0-9]%" | grep -v TUNE; }
O="kda_bounded kda gla delta_rule gated_delta_rule"
echo "-- defaults"; P --ops $O --out $W/t/default.csv
echo "-- fwd.tril=1"; P --ops $O --out $W/t/tril.csv --set fwd.tril=1
echo "-- state_fwd.decay_in=1"; P --ops kda_bounded kda gla --out $W/t/decay_in.csv --set state_fwd.decay_in=1
echo "-- both"; P --ops kda_bounded kda gla --out $W/t/both.csv --set state_fwd.decay_in=1 fwd.tril=1
echo "-- defaults again"; P --ops kda_bounded --out $W/t/default2.csv
echo "total $(( $(date +%s) - t0 )) s"
tar czf $OUT/run103.tgz -C /tmp r103
