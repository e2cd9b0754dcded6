#!/usr/bin/env bash
# run 88: state.prefetch checked (bf16 all seven, wide forms forced, head/chunk sizes, fp32), then timed
set -u
W=/tmp/r88; mkdir -p $W/c
export TRITON_CACHE_DIR=/tmp/triton_cache
C=tests/gpu/check_kernels.py
q() { grep -v "Warning\|_warn_once\|^$"; }
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
t0=$(date +%s)
(timeout 280 python3 $C --T 63 1000 --H 16 --no-fla --out $W/c/bf16_h16 > $W/c/bf16_h16.log 2>&1) &
(timeout 280 python3 $C --T 2048 8192 --H 2 --no-fla --no-step --out $W/c/bf16_h2 > $W/c/bf16_h2.log 2>&1) &
(timeout 280 python3 $C --T 63 1000 --H 16 --no-fla --no-step --ops delta_rule gated_delta_rule kda kda_bounded gla \
   --set state_fwd.output=1 bwd.x=1 state_fwd.wy=1 --out $W/c/wide > $W/c/wide.log 2>&1) &
(for kv in "64 64" "256 256" "64 128"; do set -- $kv
   timeout 120 python3 $C --T 1000 --H 4 --K $1 --V $2 --no-fla --no-step \
     --ops kda_bounded kda gla delta_rule linear_attn --out $W/c/k$1_v$2; done > $W/c/heads.log 2>&1) &
(for c in 32 16; do timeout 100 python3 $C --T 1000 --H 4 --chunk $c --no-fla --no-step \
     --ops kda_bounded kda gated_delta_rule --out $W/c/chunk$c; done > $W/c/chunks.log 2>&1
 timeout 120 python3 $C --T 63 1000 --H 16 --dtype fp32 --no-fla --no-step --ops gla gated_delta_rule kda_bounded \
   --out $W/c/fp32 > $W/c/fp32.log 2>&1) &
wait
echo "checks took $(( $(date +%s) - t0 )) s"
for f in $W/c/*.log; do echo "== $f"; q < $f | tail -12; done
bash benchmarks/tune_shapes.sh $W/t \
  "8 8192 16|kda_bounded kda|infer train|state.prefetch=0" "8 8192 16|kda_bounded kda|infer train|-" \
  "8 8192 16|gla delta_rule gated_delta_rule|infer train|state.prefetch=0" "8 8192 16|gla delta_rule gated_delta_rule|infer train|-" \
  "1 65536 16|kda_bounded|infer train|state.prefetch=0" "1 65536 16|kda_bounded|infer train|-"
tar czf $OUT/run88.tgz -C /tmp r88
