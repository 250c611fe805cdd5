#!/bin/sh
# Shows libtessera.so's limits on a real NVIDIA GPU with PyTorch. Needs
# python3 with torch, nvidia-smi, glibc >= 2.34; no Rust.
#
#   ./run.sh                      GPU 0, 4000 MiB limit, 20000 warps/s
#   LIMIT_MIB=8000 RATE=5000 ./run.sh
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
LIMIT_MIB=${LIMIT_MIB:-4000}
OVERHEAD_MIB=${OVERHEAD_MIB:-600}
RATE=${RATE:-20000}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-8}
OUT=${OUT:-$(mktemp -d)}
GPU=${GPU_UUID:-$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0 | tr -d ' ')}
REGION="python3 $HERE/tessera_region.py"
run_in() { dir=$1; shift; TESSERA_REGION_DIR="$dir" LD_PRELOAD="$HERE/libtessera.so" "$@"; }

echo "== GPU $GPU"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader -i 0 || true

echo "== memory: limit $LIMIT_MIB MiB (context charged $OVERHEAD_MIB MiB)"
$REGION create "$OUT/memory" --gpu "$GPU" --memory "$LIMIT_MIB" --overhead "$OVERHEAD_MIB"
run_in "$OUT/memory" python3 "$HERE/torch_limits.py" memory
$REGION show "$OUT/memory"

echo "== memory pages: what the driver holds per cuMemAlloc size (no libtessera.so)"
python3 "$HERE/driver_pages.py" measure

PAGES_LIMIT_MIB=$((OVERHEAD_MIB + 256))
echo "== memory pages: every size up to a $PAGES_LIMIT_MIB MiB limit under libtessera.so"
$REGION create "$OUT/pages" --gpu "$GPU" --memory "$PAGES_LIMIT_MIB" --overhead "$OVERHEAD_MIB"
run_in "$OUT/pages" python3 "$HERE/driver_pages.py" limit "$PAGES_LIMIT_MIB"

echo "== launch rate: unlimited"
$REGION create "$OUT/free" --gpu "$GPU"
run_in "$OUT/free" python3 "$HERE/torch_limits.py" rate "$SECONDS_PER_RUN"

echo "== launch rate: $RATE warps/s"
$REGION create "$OUT/slow" --gpu "$GPU" --rate "$RATE"
run_in "$OUT/slow" python3 "$HERE/torch_limits.py" rate "$SECONDS_PER_RUN"
$REGION show "$OUT/slow"

echo "== without libtessera.so (baseline)"
python3 "$HERE/torch_limits.py" rate "$SECONDS_PER_RUN"
echo "regions left in $OUT"

if [ "${SKIP_CONTROLLER:-0}" != 1 ]; then
    echo "== compute controller: tessera-agent on real NVML, PyTorch at SM targets"
    OUT="$OUT/controller" "$HERE/controller.sh"
fi
