#!/usr/bin/env bash
# Prepared device run for issue 7 (one H200, CUDA 13, cupy-cuda13x preinstalled; < 6 minutes):
#   1. environment (GPU, driver, CuPy, L2)   2. every kernel vs the float64 reference (stops on failure)
#   3. ceilings (D2D copy, streaming read)   4. the grid   5. the fit   6. $OUT/profile.json, raw.csv, table
# Needs only numpy and cupy: gpu/ is imported from the repository via PYTHONPATH (no install).
# Usage: OUT=/some/dir gpu/run_device.sh [--quick] [--max-point-gb 8] [--repeats 20]
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
OUT="${OUT:-$REPO/results/device}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"

echo "== 1. environment"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv || true
"$PY" - <<'PY' || echo "(CuPy sees no device; the next step will say why)"
import cupy, numpy
from gpu.backend import device_properties
props = device_properties()
print(f"cupy {cupy.__version__}, numpy {numpy.__version__}, CUDA runtime {props['runtime_version']}, "
      f"driver {props['driver_version']}")
print(f"{props['name']}: {props['multiprocessor_count']} SMs, L2 {props['l2_cache_bytes'] / 2**20:.0f} MiB, "
      f"{props['total_memory_bytes'] / 2**30:.0f} GiB")
PY

echo "== 2-6. checks, ceilings, grid, fit, outputs"
"$PY" -m gpu.device_run --out "$OUT" "$@"
