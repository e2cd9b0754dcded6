#!/usr/bin/env bash
# run 109: launch settings of the bounded intra forward after intra_fwd.fold (2 warps capped at 128 or 168
# registers, a cap of 96, 2 stages): no-grad forward profiled at B8 T8K H16, then the two likeliest checked
# (bf16 all seven at B8 H16 T=63/1000, H2 T=8192 bounded KDA, fp16)
set -u
W=/tmp/r109; mkdir -p $W/c $W/t
export TRITON_CACHE_DIR=/tmp/triton_cache; mkdir -p $TRITON_CACHE_DIR
C=tests/gpu/check_kernels.py
q() { grep -v "Warning\|_warn_once\|^$"; }
t0=$(date +%s)
P() { timeout 60 python3 benchmarks/profile_gpu.py --passes infer "$@" 2>&1 | q | grep -v " 0\.[0-9]%" | grep -v TUNE | grep -v "_state_fwd\|_solve\|_cumsum"; }
echo "-- defaults"; P --ops kda_bounded --out $W/t/default.csv
for S in "intra_fwd.warps=2" "intra_fwd.warps=2 intra_fwd.maxnreg=168" "intra_fwd.maxnreg=96" "intra_fwd.stages=2" "intra_fwd.maxnreg=0"; do
  echo "-- $S"; P --ops kda_bounded --out "$W/t/${S// /_}.csv" --set $S
done
echo "-- defaults again"; P --ops kda_bounded --out $W/t/default2.csv
(timeout 120 python3 $C --B 8 --T 63 1000 --H 16 --no-fla --no-step --ops kda_bounded kda --set intra_fwd.warps=2 intra_fwd.maxnreg=168 --out $W/c/w2 > $W/c/w2.log 2>&1) &
(timeout 120 python3 $C --B 8 --T 63 1000 --H 16 --no-fla --no-step --ops kda_bounded kda --set intra_fwd.stages=2 --out $W/c/s2 > $W/c/s2.log 2>&1) &
(timeout 120 python3 $C --T 8192 --H 2 --no-fla --no-step --ops kda_bounded --set intra_fwd.warps=2 intra_fwd.maxnreg=168 --out $W/c/w2h2 > $W/c/w2h2.log 2>&1) &
(timeout 120 python3 $C --T 1000 --H 16 --dtype fp16 --no-fla --no-step --ops kda_bounded --set intra_fwd.warps=2 intra_fwd.maxnreg=168 --out $W/c/w2fp16 > $W/c/w2fp16.log 2>&1) &
wait
for f in $W/c/*.log; do echo "== $f"; q < $f | grep -v TUNE | cut -c1-140 | tail -5; done
echo "total $(( $(date +%s) - t0 )) s"
tar czf $OUT/run109.tgz -C /tmp r109
