#!/usr/bin/env bash
# run 99: the intra backward's exponentials as ex2.approx.ftz (intra_bwd.ftz) and the solve capped at 128
# registers (solve.maxnreg), both on by default: checked (bf16 B8 H16 T=63/1000 and B1 H2 T=8192, fp16, fp32), then
# timed against the previous forms
set -u
W=/tmp/r99; mkdir -p $W/c $W/t
export TRITON_CACHE_DIR=/tmp/triton_cache; mkdir -p $TRITON_CACHE_DIR
C=tests/gpu/check_kernels.py
q() { grep -v "Warning\|_warn_once\|^$"; }
t0=$(date +%s)
D="kda_bounded kda gla delta_rule gated_delta_rule"
(timeout 200 python3 $C --B 8 --T 63 1000 --H 16 --no-fla --no-step --ops $D --out $W/c/b8_h16 > $W/c/b8_h16.log 2>&1) &
(timeout 200 python3 $C --T 8192 --H 2 --no-fla --no-step --ops $D --out $W/c/h2 > $W/c/h2.log 2>&1) &
(timeout 200 python3 $C --T 1000 --H 16 --dtype fp16 --no-fla --no-step --ops $D --out $W/c/fp16 > $W/c/fp16.log 2>&1) &
(timeout 200 python3 $C --T 63 1000 --H 16 --dtype fp32 --no-fla --no-step --ops kda_bounded kda gla --out $W/c/fp32 > $W/c/fp32.log 2>&1) &
wait
echo "checks took $(( $(date +%s) - t0 )) s"
for f in $W/c/*.log; do echo "== $f"; q < $f | grep -v TUNE | cut -c1-140 | tail -11; done
P() { timeout 100 python3 benchmarks/profile_gpu.py "$@" 2>&1 | q | grep -v " 0\.[0-9]%" | grep -v TUNE; }
echo "-- defaults"; P --ops kda_bounded kda gla delta_rule gated_delta_rule --passes infer train --out $W/t/default.csv
echo "-- intra_bwd.ftz=0 solve.maxnreg=0"; P --ops kda_bounded kda gla delta_rule --passes infer train --out $W/t/old.csv --set intra_bwd.ftz=0 solve.maxnreg=0
echo "total $(( $(date +%s) - t0 )) s"
tar czf $OUT/run99.tgz -C /tmp r99
