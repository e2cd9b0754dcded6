#!/usr/bin/env bash
# run 98: the intra forward's exponentials as ex2.approx.ftz (intra_fwd.ftz) checked (bf16 B8 H16 T=63/1000, B1 H16
# T=63/1000, H2 T=8192, fp16; its default on) and timed against tl.exp; launch settings that the unchained state
# passes may have changed (16 warps: sm_90 120 registers, no product computed twice) and a register cap for the solve
set -u
W=/tmp/r98; mkdir -p $W/c $W/t
export TRITON_CACHE_DIR=/tmp/triton_cache; mkdir -p $TRITON_CACHE_DIR
C=tests/gpu/check_kernels.py
q() { grep -v "Warning\|_warn_once\|^$"; }
t0=$(date +%s)
D="kda_bounded kda gla"
(timeout 200 python3 $C --B 8 --T 63 1000 --H 16 --no-fla --no-step --ops $D --out $W/c/b8_h16 > $W/c/b8_h16.log 2>&1) &
(timeout 200 python3 $C --T 63 1000 --H 16 --no-fla --no-step --ops $D --out $W/c/b1_h16 > $W/c/b1_h16.log 2>&1) &
(timeout 200 python3 $C --T 8192 --H 2 --no-fla --no-step --ops $D --out $W/c/h2 > $W/c/h2.log 2>&1) &
(timeout 200 python3 $C --T 1000 --H 16 --dtype fp16 --no-fla --no-step --ops $D --out $W/c/fp16 > $W/c/fp16.log 2>&1) &
(timeout 200 python3 $C --B 8 --T 1000 --H 16 --no-fla --no-step --ops kda_bounded delta_rule gated_delta_rule --set state_fwd.warps=16 state_bwd.warps=16 --out $W/c/w16 > $W/c/w16.log 2>&1) &
wait
echo "checks took $(( $(date +%s) - t0 )) s"
for f in $W/c/*.log; do echo "== $f"; q < $f | grep -v TUNE | cut -c1-140 | tail -8; done
P() { timeout 100 python3 benchmarks/profile_gpu.py "$@" 2>&1 | q | grep -v " 0\.[0-9]%" | grep -v TUNE; }
echo "-- infer defaults"; P --ops kda_bounded kda gla --passes infer --out $W/t/infer_default.csv
echo "-- infer ftz=0"; P --ops kda_bounded kda gla --passes infer --out $W/t/infer_ftz0.csv --set intra_fwd.ftz=0
echo "-- infer state_fwd.warps=16"; P --ops kda_bounded delta_rule --passes infer --out $W/t/infer_w16.csv --set state_fwd.warps=16
echo "-- infer solve.maxnreg=128"; P --ops kda_bounded --passes infer --out $W/t/infer_s128.csv --set solve.maxnreg=128
echo "-- infer solve.maxnreg=96"; P --ops kda_bounded --passes infer --out $W/t/infer_s96.csv --set solve.maxnreg=96
echo "-- infer intra_fwd.maxnreg=0"; P --ops kda_bounded --passes infer --out $W/t/infer_i0.csv --set intra_fwd.maxnreg=0
echo "-- train warps=16"; P --ops kda_bounded delta_rule --passes train --out $W/t/train_w16.csv --set state_fwd.warps=16 state_bwd.warps=16
echo "-- train defaults"; P --ops kda_bounded delta_rule --passes train --out $W/t/train_default.csv
echo "total $(( $(date +%s) - t0 )) s"
tar czf $OUT/run98.tgz -C /tmp r98
