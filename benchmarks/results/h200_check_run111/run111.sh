#!/usr/bin/env bash
# run 111: G stored times log2(e) in the bounded gate's no-grad forward (fwd.log2, on by default in the working
# tree) checked with nothing forced (bf16 all seven at B=8 H=16 T=63/1000 with the decode step, B=1 H=16
# T=63/1000, H=2 T=2048/8192, fp16 and fp32 at T=1000; with slow gates on every other channel at B=8 H=16
# T=1000 and H=2 T=8192), A_kk in bf16 without a gradient (fwd.akk_bf16=1) checked for the delta rule's
# ops, then the no-grad forward profiled at B8 T8K H16 with each on and off
set -u
W=/tmp/r111; mkdir -p $W/c $W/t
export TRITON_CACHE_DIR=/tmp/triton_cache; mkdir -p $TRITON_CACHE_DIR
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $W/gpu.txt
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a $W/gpu.txt
C=tests/gpu/check_kernels.py
q() { grep -v "Warning\|_warn_once\|^$"; }
t0=$(date +%s)
D="delta_rule gated_delta_rule kda kda_bounded"
timeout 200 python3 $C --B 8 --T 63 1000 --H 16 --no-fla --out $W/c/b8_h16 > $W/c/b8_h16.log 2>&1 &
timeout 200 python3 $C --T 63 1000 --H 16 --no-fla --no-step --out $W/c/b1_h16 > $W/c/b1_h16.log 2>&1 &
timeout 200 python3 $C --T 2048 8192 --H 2 --no-fla --no-step --out $W/c/h2 > $W/c/h2.log 2>&1 &
(timeout 100 python3 $C --T 1000 --H 16 --dtype fp16 --no-fla --no-step --out $W/c/fp16 > $W/c/fp16.log 2>&1
 timeout 100 python3 $C --T 1000 --H 16 --dtype fp32 --no-fla --no-step --out $W/c/fp32 > $W/c/fp32.log 2>&1) &
(timeout 100 python3 $C --B 8 --T 1000 --H 16 --slow-gates --no-fla --no-step --out $W/c/slow_b8 > $W/c/slow_b8.log 2>&1
 timeout 100 python3 $C --T 8192 --H 2 --slow-gates --no-fla --no-step --out $W/c/slow_h2 > $W/c/slow_h2.log 2>&1) &
(timeout 100 python3 $C --B 8 --T 63 1000 --H 16 --ops $D --no-fla --no-step --set fwd.akk_bf16=1 --out $W/c/akk_b8 > $W/c/akk_b8.log 2>&1
 timeout 100 python3 $C --T 8192 --H 2 --ops $D --no-fla --no-step --set fwd.akk_bf16=1 --out $W/c/akk_h2 > $W/c/akk_h2.log 2>&1
 timeout 100 python3 $C --B 8 --T 1000 --H 16 --ops $D --slow-gates --no-fla --no-step --set fwd.akk_bf16=1 --out $W/c/akk_slow > $W/c/akk_slow.log 2>&1) &
wait
for f in $W/c/*.log; do echo "== $f"; q < $f | grep -v TUNE | cut -c1-150 | tail -17; done
echo "checked in $(( $(date +%s) - t0 )) s"
P() { timeout 90 python3 benchmarks/profile_gpu.py --passes infer "$@" 2>&1 | q | grep -v " 0\.[0-9]%" | grep -v TUNE; }
echo "-- defaults"; P --ops kda_bounded --out $W/t/default.csv
for S in "fwd.log2=0" "fwd.akk_bf16=1" "fwd.log2=0 fwd.akk_bf16=1"; do
  echo "-- $S"; P --ops kda_bounded --out "$W/t/${S// /_}.csv" --set $S
done
echo "-- defaults again"; P --ops kda_bounded --out $W/t/default2.csv
echo "-- others, defaults"; P --ops kda delta_rule gated_delta_rule gla --out $W/t/others.csv
echo "-- others, fwd.akk_bf16=1"; P --ops kda delta_rule gated_delta_rule --out $W/t/others_akk.csv --set fwd.akk_bf16=1
echo "total $(( $(date +%s) - t0 )) s"
tar czf $OUT/run111.tgz -C /tmp r111
