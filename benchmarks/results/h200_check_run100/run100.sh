#!/usr/bin/env bash
# run 100: the no-grad forward in segments of the sequence (fwd.segments: each segment's state pass on a second
# stream beside the next one's intra forward and solve). The kernels take a first chunk (C0; the state pass
# C0..C1), so the defaults are checked again (bf16 all seven B8 H16 T=63/1000 with the decode step, B1 H2
# T=8192, fp32), then the segments forced (B8 H16 T=1000, 4 segments), then timed end to end (do_bench: the
# passes overlap, so the kernels' summed GPU time would not show it) with 1, 2, 4 and 8 segments
set -u
W=/tmp/r100; mkdir -p $W/c $W/t
export TRITON_CACHE_DIR=/tmp/triton_cache; mkdir -p $TRITON_CACHE_DIR
C=tests/gpu/check_kernels.py
q() { grep -v "Warning\|_warn_once\|^$"; }
t0=$(date +%s)
(timeout 200 python3 $C --B 8 --T 63 1000 --H 16 --no-fla --out $W/c/b8_h16 > $W/c/b8_h16.log 2>&1) &
(timeout 200 python3 $C --T 8192 --H 2 --no-fla --no-step --out $W/c/h2 > $W/c/h2.log 2>&1) &
(timeout 200 python3 $C --B 8 --T 1000 --H 16 --no-fla --no-step --set fwd.segments=4 --out $W/c/seg4 > $W/c/seg4.log 2>&1) &
(timeout 200 python3 $C --T 1000 --H 16 --dtype fp32 --no-fla --no-step --out $W/c/fp32 > $W/c/fp32.log 2>&1) &
wait
echo "checks took $(( $(date +%s) - t0 )) s"
for f in $W/c/*.log; do echo "== $f"; q < $f | grep -v TUNE | cut -c1-140 | tail -16; done
for n in 1 2 4 8; do
  echo "-- fwd.segments=$n"
  timeout 100 python3 benchmarks/bench_gpu.py --out $W/t/seg$n --impls ours --skip-sweep --skip-decode --shapes B8T8K \
    --ops kda_bounded kda delta_rule gla --set fwd.segments=$n 2>&1 | grep -vi warn | grep -e "^| B8"
done
echo "total $(( $(date +%s) - t0 )) s"
tar czf $OUT/run100.tgz -C /tmp r100
