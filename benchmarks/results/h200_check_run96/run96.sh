#!/usr/bin/env bash
# run 96: the bounded gate's no-grad intra forward from the raw gates (intra_fwd.carry: sums inside 16-row
# blocks as products with triangles of ones; G written at block ends only) and A_kk's zeros not stored without
# a gradient (intra_fwd.kk_zeros): checked (bf16 B8 H16 and B1 H16 T=63/1000, H2 T=2048/8192, fp16, fp32), then
# profiled both ways; and launch settings the unchained state passes may have changed (8 warps for the delta
# rule's no-grad state pass, 128-column reverse passes for the delta rule and GDN)
set -u
W=/tmp/r96; mkdir -p $W/c $W/t
export TRITON_CACHE_DIR=/tmp/triton_cache; mkdir -p $TRITON_CACHE_DIR
C=tests/gpu/check_kernels.py
q() { grep -v "Warning\|_warn_once\|^$"; }
t0=$(date +%s)
D="kda_bounded kda delta_rule gated_delta_rule"
(timeout 200 python3 $C --B 8 --T 63 1000 --H 16 --no-fla --no-step --ops $D --out $W/c/b8_h16 > $W/c/b8_h16.log 2>&1) &
(timeout 200 python3 $C --T 63 1000 --H 16 --no-fla --no-step --ops $D --out $W/c/b1_h16 > $W/c/b1_h16.log 2>&1) &
(timeout 200 python3 $C --T 2048 8192 --H 2 --no-fla --no-step --ops $D --out $W/c/h2 > $W/c/h2.log 2>&1) &
(timeout 200 python3 $C --T 1000 --H 16 --dtype fp16 --no-fla --no-step --ops $D --out $W/c/fp16 > $W/c/fp16.log 2>&1;
 timeout 200 python3 $C --T 100 1000 --H 16 --dtype fp32 --no-fla --no-step --ops kda_bounded --out $W/c/fp32 > $W/c/fp32.log 2>&1) &
wait
echo "checks took $(( $(date +%s) - t0 )) s"
for f in $W/c/*.log; do echo "== $f"; q < $f | grep -v TUNE | cut -c1-140 | tail -12; done
P() { timeout 120 python3 benchmarks/profile_gpu.py "$@" 2>&1 | q | grep -v " 0\.[0-9]%" | grep -v TUNE; }
echo "-- infer defaults"; P --ops kda_bounded kda delta_rule gated_delta_rule --passes infer --out $W/t/infer_default.csv
echo "-- infer carry=0"; P --ops kda_bounded --passes infer --out $W/t/infer_carry0.csv --set intra_fwd.carry=0
echo "-- infer carry=0 kk_zeros=1"; P --ops kda_bounded kda delta_rule gated_delta_rule --passes infer --out $W/t/infer_old.csv --set intra_fwd.carry=0 intra_fwd.kk_zeros=1
echo "-- infer state_fwd.warps=8"; P --ops delta_rule linear_attn --passes infer --out $W/t/infer_w8.csv --set state_fwd.warps=8
echo "-- train state_bwd 128 columns, 8 warps"; P --ops delta_rule gated_delta_rule --passes train --out $W/t/train_bwd128.csv --set state_bwd.bv=128 state_bwd.warps=8 state_bwd.stages=2
echo "-- train defaults"; P --ops delta_rule gated_delta_rule --passes train --out $W/t/train_default.csv
echo "total $(( $(date +%s) - t0 )) s"
tar czf $OUT/run96.tgz -C /tmp r96
