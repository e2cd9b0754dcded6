#!/usr/bin/env bash
# run 89: state_fwd.early / state_bwd.early = 1 checked (bf16 all seven), then 0/1/2 timed at three shapes
set -u
W=/tmp/r89; mkdir -p $W/c $W/t
export TRITON_CACHE_DIR=/tmp/triton_cache
C=tests/gpu/check_kernels.py
q() { grep -v "Warning\|_warn_once\|^$"; }
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
t0=$(date +%s)
S="--set state_fwd.early=1 state_bwd.early=1"
(timeout 200 python3 $C --T 63 1000 --H 16 --no-fla --no-step $S --out $W/c/e1_h16 > $W/c/e1_h16.log 2>&1) &
(timeout 200 python3 $C --T 8192 --H 2 --no-fla --no-step $S --out $W/c/e1_h2 > $W/c/e1_h2.log 2>&1) &
(timeout 200 python3 $C --T 63 1000 --H 16 --no-fla --no-step --ops delta_rule gated_delta_rule kda kda_bounded gla \
   $S state_fwd.output=1 bwd.x=1 state_fwd.wy=1 --out $W/c/e1_wide > $W/c/e1_wide.log 2>&1) &
(timeout 200 python3 $C --T 63 1000 --H 16 --dtype fp32 --no-fla --no-step --ops gla gated_delta_rule kda_bounded \
   $S --out $W/c/e1_fp32 > $W/c/e1_fp32.log 2>&1) &
wait
echo "checks took $(( $(date +%s) - t0 )) s"
for f in $W/c/*.log; do echo "== $f"; q < $f | tail -12 | cut -c1-130; done
P() { timeout 150 python3 benchmarks/profile_gpu.py "$@" 2>&1 | q | grep -v " 0\.[0-9]%" | grep "==\|state\|output" ; }
ALL="linear_attn simple_gla gla delta_rule gated_delta_rule kda kda_bounded"
for e in 0 1 2; do echo "-- B8 T8K early=$e"; P --B 8 --T 8192 --H 16 --ops $ALL --passes infer train --out $W/t/b8_e$e.csv --set state_fwd.early=$e state_bwd.early=$e; done
for e in 0 1 2; do echo "-- B32 T2K early=$e"; P --B 32 --T 2048 --H 2 --ops $ALL --passes infer train --out $W/t/b32_e$e.csv --set state_fwd.early=$e state_bwd.early=$e; done
for e in 0 1 2; do echo "-- B1 T64K early=$e"; P --B 1 --T 65536 --H 16 --ops kda_bounded gla delta_rule gated_delta_rule --passes infer train --out $W/t/b1_e$e.csv --set state_fwd.early=$e state_bwd.early=$e; done
echo "total $(( $(date +%s) - t0 )) s"
tar czf $OUT/run89.tgz -C /tmp r89
