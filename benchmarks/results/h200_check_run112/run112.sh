#!/usr/bin/env bash
# run 112: launch settings after fwd.log2 and fwd.akk_bf16 (commit 60eb64b), the no-grad forward of bounded KDA
# at B8 T8K H16 profiled with each: the intra forward capped at 144 registers (7 programs per SM), at 1 warp
# without a cap (no duplicated products, 255 registers), the solve at 112 registers or no cap; then the wall
# clock of ours alone for bounded KDA at B8 T8K (bench_gpu.py, defaults)
set -u
W=/tmp/r112; mkdir -p $W/t
export TRITON_CACHE_DIR=/tmp/triton_cache; mkdir -p $TRITON_CACHE_DIR
q() { grep -v "Warning\|_warn_once\|^$"; }
t0=$(date +%s)
P() { timeout 90 python3 benchmarks/profile_gpu.py --passes infer "$@" 2>&1 | q | grep -v " 0\.[0-9]%" | grep -v TUNE; }
echo "-- defaults"; P --ops kda_bounded --out $W/t/default.csv
for S in "intra_fwd.maxnreg=144" "intra_fwd.warps=1 intra_fwd.maxnreg=0" "solve.maxnreg=112" "solve.maxnreg=0"; do
  echo "-- $S"; P --ops kda_bounded --out "$W/t/${S// /_}.csv" --set $S
done
echo "-- defaults again"; P --ops kda_bounded --out $W/t/default2.csv
timeout 150 python3 benchmarks/bench_gpu.py --out $W/bench --impls ours --skip-sweep --skip-decode --shapes B8T8K \
  --ops kda_bounded kda 2>&1 | grep -vi warn | grep -e "^| B" | head
echo "total $(( $(date +%s) - t0 )) s"
tar czf $OUT/run112.tgz -C /tmp r112
