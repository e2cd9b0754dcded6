#!/usr/bin/env bash
# run 86: the kernels of now (runs 82-84's changes): bf16 checks of all seven, ours and SDPA side by side at
# both shapes (with decode), FLA's bounded KDA beside them at B8 T8K, per-kernel profile, the B1 sweep
set -u
export TRITON_CACHE_DIR=/tmp/triton_cache; mkdir -p $TRITON_CACHE_DIR
O=$OUT/r86; mkdir -p $O
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/fla_core-*.whl
export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $O/gpu.txt
python3 -c "import torch, triton, fla; print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__)" | tee -a $O/gpu.txt
pack() { save=$(cd $TRITON_CACHE_DIR && find . -name '*.autotune.json'); (cd $TRITON_CACHE_DIR && for f in $save; do mkdir -p $O/triton_autotune/$(dirname $f); cp $f $O/triton_autotune/$f; done); tar czf $OUT/r86.tgz -C $OUT r86; }
t=$(date +%s)
pids=()
FLA_CACHE_RESULTS=0 timeout 220 python3 benchmarks/bench_gpu.py --compile-only --impls fla --ops kda_bounded --shapes B8T8K --out $O/c 2>&1 | grep -e "^compile" >>$O/compile.log &
pids+=($!)
for s in B32T2K B8T8K; do
  timeout 200 python3 benchmarks/bench_gpu.py --compile-only --impls ours --shapes $s --out $O/c 2>&1 | grep -e "^compile" >>$O/compile.log &
  pids+=($!)
done
timeout 200 python3 tests/gpu/check_kernels.py --T 2048 8192 --H 2 --no-step --no-fla --out $O/check_long >$O/check_long.txt 2>&1 &
pids+=($!)
timeout 100 python3 tests/gpu/check_kernels.py --T 63 1000 --H 16 --no-fla --out $O/check_bf16 2>&1 | grep -vi warn | tail -17
wait "${pids[@]}"
grep -vi warn $O/check_long.txt | tail -16
echo "compiled in $(($(date +%s) - t)) s"; cat $O/compile.log
pack
timeout 120 python3 benchmarks/bench_gpu.py --out $O/bench --impls ours sdpa --skip-sweep --budget-s 100 2>&1 | grep -vi warn | grep -v "^|" | tail -5
pack
timeout 110 python3 benchmarks/bench_gpu.py --out $O/bench_fla --impls fla --ops kda_bounded --shapes B8T8K --skip-sweep --skip-decode --budget-s 100 --autotune-rep 20 2>&1 | grep -vi warn | tail -3
pack
timeout 110 python3 benchmarks/profile_gpu.py --out $O/profile.csv 2>&1 | grep -vi warn | grep -e "^==" -e "TUNE" | head -20
pack
rem=$((575 - ($(date +%s) - t))); echo "sweep gets $rem s"
[ $rem -gt 30 ] && timeout $rem python3 benchmarks/bench_gpu.py --out $O/sweep --impls ours sdpa --skip-decode --skip-fixed --budget-s $((rem - 20)) --ops kda kda_bounded 2>&1 | grep -vi warn | grep -v "^|" | tail -3
pack
echo "total $(($(date +%s) - t)) s"
