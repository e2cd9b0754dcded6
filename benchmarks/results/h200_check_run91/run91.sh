#!/usr/bin/env bash
# run 91: state_fwd.beta_x (L as loaded, beta on X's rows) checked with the WY forms forced, timed 0 / 1,
# then ours, FLA 0.6.0 and SDPA side by side at both shapes with the winner
set -u
W=/tmp/r91; mkdir -p $W/c $W/t $W/b
export TRITON_CACHE_DIR=/tmp/triton_cache; mkdir -p $TRITON_CACHE_DIR
cp -r benchmarks/fla_autotune/. $TRITON_CACHE_DIR/
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/fla_core-*.whl
export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $W/gpu.txt
python3 -c "import torch, triton, fla; print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__)" | tee -a $W/gpu.txt
C=tests/gpu/check_kernels.py
q() { grep -v "Warning\|_warn_once\|^$"; }
t0=$(date +%s)
# FLA's chosen configs compiled meanwhile (CPU), one process per shape
for s in B8T8K B32T2K; do
  (timeout 200 python3 benchmarks/bench_gpu.py --compile-only --impls fla --shapes $s --out $W/b/c 2>&1 | grep -e "^compile" >> $W/b/compile.log) &
done
S="--set state_fwd.wy=1 state_fwd.output=1 bwd.x=1 state_fwd.beta_x=1"
D="delta_rule gated_delta_rule kda kda_bounded"
(timeout 150 python3 $C --T 63 1000 --H 16 --no-fla --no-step --ops $D $S --out $W/c/bx_h16 > $W/c/bx_h16.log 2>&1) &
(timeout 150 python3 $C --T 2048 8192 --H 2 --no-fla --no-step --ops $D $S --out $W/c/bx_h2 > $W/c/bx_h2.log 2>&1) &
(for c in 32 16; do timeout 70 python3 $C --T 1000 --H 4 --chunk $c --no-fla --no-step --ops $D $S --out $W/c/bx_chunk$c; done > $W/c/bx_chunks.log 2>&1
 timeout 70 python3 $C --T 1000 --H 16 --dtype fp16 --no-fla --no-step --ops $D $S --out $W/c/bx_fp16 > $W/c/bx_fp16.log 2>&1) &
(timeout 100 python3 $C --T 1000 --H 16 --dtype fp32 --no-fla --no-step --ops $D $S --out $W/c/bx_fp32 > $W/c/bx_fp32.log 2>&1) &
wait
echo "checks (and FLA's compile) took $(( $(date +%s) - t0 )) s"
for f in $W/c/*.log; do echo "== $f"; q < $f | grep -v TUNE | cut -c1-130 | tail -12; done
sort $W/b/compile.log | tail -20
P() { timeout 100 python3 benchmarks/profile_gpu.py "$@" 2>&1 | q | grep -v " 0\.[0-9]%" | grep -v TUNE; }
for b in 0 1; do echo "-- B8 T8K beta_x=$b"; P --B 8 --T 8192 --H 16 --ops $D --passes infer train --out $W/t/b8_$b.csv --set state_fwd.beta_x=$b; done
for b in 0 1; do echo "-- B32 T2K beta_x=$b"; P --B 32 --T 2048 --H 2 --ops $D --passes infer train --out $W/t/b32_$b.csv --set state_fwd.beta_x=$b; done
win=$(python3 - <<'PY'
import csv
tot = {}
for b in (0, 1):
    for f in (f"/tmp/r91/t/b8_{b}.csv", f"/tmp/r91/t/b32_{b}.csv"):
        for r in csv.DictReader(open(f)):
            if r["op"] in ("kda_bounded", "kda", "delta_rule"):
                tot[b] = tot.get(b, 0.0) + float(r["ms"])
print(1 if tot.get(1, 9e9) <= tot.get(0, 0) else 0)
PY
)
echo "beta_x totals decide: $win"
rem=$((560 - ($(date +%s) - t0))); echo "timed run gets $rem s"
timeout $rem python3 benchmarks/bench_gpu.py --out $W/b --impls ours fla sdpa --skip-sweep --shapes B8T8K B32T2K \
  --budget-s $((rem - 30)) --autotune-rep 20 --set state_fwd.beta_x=$win 2>&1 | grep -vi warn | grep -e "^| B" -e "^- " | head -40
echo "total $(( $(date +%s) - t0 )) s"
tar czf $OUT/run91.tgz -C /tmp r91
