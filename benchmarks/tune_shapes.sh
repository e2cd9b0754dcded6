#!/usr/bin/env bash
# Per-kernel profiles of launch settings at several shapes, one line per try, for a device call:
#   bash benchmarks/tune_shapes.sh OUT "B T H|OPS|PASSES|SETTINGS" ...
# e.g. bash benchmarks/tune_shapes.sh OUT "8 8192 16|kda_bounded delta_rule|train|state_fwd.warps=4"
# SETTINGS may be "-" (the defaults). Each try writes OUT/<n>.csv and prints its per-kernel summary.
set -u
OUT=$1
shift
mkdir -p "$OUT"
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$HOME/.triton/cache}"
n=0
for spec in "$@"; do
  n=$((n + 1))
  IFS='|' read -r shape ops passes settings <<<"$spec"
  read -r B T H <<<"$shape"
  echo "-- try $n: B$B T$T H$H ops=[$ops] passes=[$passes] set=[$settings]"
  args=()
  [ "$settings" != "-" ] && args=(--set ${settings//,/ })
  # shellcheck disable=SC2086
  timeout 120 python3 benchmarks/profile_gpu.py --B "$B" --T "$T" --H "$H" --ops $ops --passes $passes \
    --out "$OUT/$n.csv" "${args[@]}" 2>&1 | grep -v "Warning\|_warn_once\|^$" | grep -v " 0\.[0-9]%"
done
