#!/usr/bin/env bash
# run 106: fwd.cumsum_fused again, its rounds now [cumsum of round r][intra of round r - LAG] (run 105 had each
# round's intra programs right behind their own cumsum programs, which then waited): checked forced on
# (bf16 B8 H16 T=63/1000, H2 T=8192, fp16), then the no-grad forward profiled for round sizes, lags and
# tickets against the defaults at B8 T8K H16
set -u
W=/tmp/r106; mkdir -p $W/c $W/t
export TRITON_CACHE_DIR=/tmp/triton_cache; mkdir -p $TRITON_CACHE_DIR
C=tests/gpu/check_kernels.py
q() { grep -v "Warning\|_warn_once\|^$"; }
t0=$(date +%s)
D="kda_bounded kda gla"
(timeout 150 python3 $C --B 8 --T 63 1000 --H 16 --no-fla --no-step --ops $D --set fwd.cumsum_fused=132 --out $W/c/b8_h16 > $W/c/b8_h16.log 2>&1) &
(timeout 150 python3 $C --T 8192 --H 2 --no-fla --no-step --ops $D --set fwd.cumsum_fused=132 fwd.cumsum_lag=2 --out $W/c/h2 > $W/c/h2.log 2>&1) &
(timeout 150 python3 $C --T 1000 --H 16 --dtype fp16 --no-fla --no-step --ops $D --set fwd.cumsum_fused=528 --out $W/c/fp16 > $W/c/fp16.log 2>&1) &
wait
echo "checks took $(( $(date +%s) - t0 )) s"
for f in $W/c/*.log; do echo "== $f"; q < $f | grep -v TUNE | cut -c1-140 | tail -7; done
P() { timeout 60 python3 benchmarks/profile_gpu.py --passes infer "$@" 2>&1 | q | grep -v " 0\.[0-9]%" | grep -v TUNE | grep -v "== \|_state_fwd\|_solve"; }
echo "-- defaults"; P --ops kda_bounded --out $W/t/default.csv
for S in "66" "132" "264" "528" "132 fwd.cumsum_lag=2" "264 fwd.cumsum_lag=2" "132 fwd.cumsum_ticket=0" "528 fwd.cumsum_ticket=0"; do
  echo "-- fwd.cumsum_fused=$S"; P --ops kda_bounded --out "$W/t/fused_${S// /_}.csv" --set fwd.cumsum_fused=$S
done
echo "-- kda defaults / 264"; P --ops kda --out $W/t/kda_default.csv; P --ops kda --out $W/t/kda_264.csv --set fwd.cumsum_fused=264
echo "total $(( $(date +%s) - t0 )) s"
tar czf $OUT/run106.tgz -C /tmp r106
