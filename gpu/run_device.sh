#!/usr/bin/env bash
# Prepared device run (issues 7, 13, 15): one H200, CUDA 13, cupy-cuda13x 14.2, numpy 2.5, Python 3.12.
#   1. environment   2. checks: every kernel instantiation, every grid shape family (at the top of the
#   arena) and every GEMM vs the float64 reference -- stops before timing on any mismatch (exit 1)
#   3. warm-up, ceilings   4. linear layers (bf16 GEMMs, Vidur CSV)   5. the grid   6. fit, outputs
# Needs only numpy and cupy: gpu/ is imported from the repository via PYTHONPATH (no install).
# Expected wall time: ~5 minutes (budget 270 s for timing + ~40 s of compile, checks and fills).
#
# Through the device tool, use exactly:
#   run(command="bash gpu/run_device.sh", timeout_s=480)
# (480 s leaves one rerun inside the 15 minutes of device time, start-up included.)
#
# Files in $OUT (6, at most 7; all 0644): log.txt (everything printed), checks.csv (before any timing),
# raw.csv and linear.mlp.csv (appended row by row), profile.json, table.txt, and errors.csv only if a
# point raised. Exit codes: see gpu/device_run.py (0 ok, 1 mismatch, 2 no device, 3 point errors,
# 4 crashed, 5 interrupted); a partial profile is written for 3, 4 and 5.
# Usage: OUT=/some/dir gpu/run_device.sh [--quick] [--max-point-gb 8] [--repeats 20] [--no-linear]
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
OUT="${OUT:-$REPO/results/device}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
umask 022
LOG="$OUT/log.txt"
: >"$LOG"

echo 'device tool call: run(command="bash gpu/run_device.sh", timeout_s=480)' | tee -a "$LOG"
echo "== 1. environment" | tee -a "$LOG"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1 \
  | tee -a "$LOG" || true
"$PY" - <<'PY' 2>&1 | tee -a "$LOG" || true
import sys
import numpy
print(f"python {sys.version.split()[0]}, numpy {numpy.__version__}")
try:
    import cupy
    from gpu.backend import device_properties
    props = device_properties()
    print(f"cupy {cupy.__version__}, CUDA runtime {props['runtime_version']}, driver {props['driver_version']}")
    print(f"{props['name']}: {props['multiprocessor_count']} SMs, L2 {props['l2_cache_bytes'] / 2**20:.0f} MiB, "
          f"{props['total_memory_bytes'] / 2**30:.0f} GiB")
except Exception as exc:  # the next step says why, with its own exit code
    print(f"(no usable CuPy device: {type(exc).__name__}: {exc})")
PY

echo "== 2-6. checks, warm-up and ceilings, linear layers, grid, fit, outputs" | tee -a "$LOG"
"$PY" -m gpu.device_run --out "$OUT" "$@" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
echo "== done: exit $rc; files in $OUT:" | tee -a "$LOG"
ls -l "$OUT" | tee -a "$LOG"
exit "$rc"
