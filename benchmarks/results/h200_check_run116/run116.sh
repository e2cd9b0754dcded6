#!/usr/bin/env bash
# run 116: after the review mends of 5f0509b (same PTX for every kernel; the PDL rule now asked once a device):
# bf16 all seven at B=8 H=16 T=63/1000 with the decode step, then the wall clock of bounded KDA at B8 T8K with
# fwd.pdl on and off, and which launches took PDL
set -u
W=/tmp/r116; mkdir -p $W
export TRITON_CACHE_DIR=/tmp/triton_cache; mkdir -p $TRITON_CACHE_DIR
python3 -c "import torch; from kernels.triton import chunk; q = torch.zeros(1, device='cuda'); print('pdl rule', chunk._gdc_on(q.device.index), chunk.HAS_GDC)"
timeout 200 python3 tests/gpu/check_kernels.py --B 8 --T 63 1000 --H 16 --no-fla --out $W/b8_h16 2>&1 | grep -v "Warning\|_warn_once\|^$" | cut -c1-150 | tail -17
for p in 1 0 1; do
  timeout 100 python3 benchmarks/bench_gpu.py --out $W/bench_pdl${p}_$RANDOM --impls ours --skip-sweep --skip-decode --shapes B8T8K \
    --ops kda_bounded --set fwd.pdl=$p 2>&1 | grep -vi warn | grep -e "^| B8T8K | [a-z_]* | [0-9]" | head -1 | sed "s/^/pdl=$p /"
done
tar czf $OUT/run116.tgz -C /tmp r116
