#!/usr/bin/env bash
# The decode engine on a GPU (issue "GPU-grade decode engine"), one prepared script of at most
# ~8 minutes on an H100/H200-class GPU, no downloads (random weights, the shipped shapes worlds):
#
#     bash benchmarks/gpu_engine.sh            # OUT=results/gpu_engine/<time>
#
# 0. tests/test_engine.py -m gpu: every decoder batch-independent on CUDA (where the loop's "any row
#    left" check is read one step late), compiled and eager greedy decodes equal.
# 1. benchmarks/engine.py on CUDA: loop / model aten ops and host reads per step for every decoder
#    (plus the syncs torch's sync debug mode reports); raster per-step latency of the full-size
#    LlamaGen-XL 512, Tar-1.5B 512 and Tar-7B 1024 architectures in bf16, eager and engine=compiled
#    (torch.compile, CUDA graphs), against the memory floor measured in the same run; one forward
#    at each decoder's width.
# 2. benchmarks/mulo.py --model shapes_x2 on CUDA with engine=eager, then engine=compiled: the main
#    table (raster, SJD, EAGLE-2, LANTERN, ZipAR, MuLo-SD) timed at batch 1.
#
# Needs: one CUDA GPU (40 GB hold Tar-7B 1024 in bf16 at batch 16, docs/methodology.md), `pip install -e .` (Triton comes with
# CUDA builds of torch). Every part writes its output to $OUT; the summary tables are printed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
OUT=${OUT:-results/gpu_engine/$(date +%Y-%m-%d_%H-%M-%S)}
IMAGES=${IMAGES:-8}
mkdir -p "$OUT"
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_engine.sh needs a CUDA GPU')" || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

echo "=== CUDA checks: batch independence with the lagged loop check, compiled = eager (greedy)"
timeout 240 "$PY" -m pytest -q -m gpu tests/test_engine.py 2>&1 | tail -15 | tee "$OUT/checks.txt"

echo "=== benchmarks/engine.py (CUDA)"
timeout 300 "$PY" benchmarks/engine.py --device cuda --steps 64 2>&1 | tee "$OUT/engine.txt"

for engine in eager compiled; do
  echo "=== benchmarks/mulo.py --model shapes_x2 engine=$engine"
  timeout 240 "$PY" benchmarks/mulo.py --model shapes_x2 --device cuda --images "$IMAGES" --reps 2 \
    --out "$OUT/mulo_$engine" engine="$engine" 2>&1 | tail -30 | tee "$OUT/mulo_$engine.txt"
done
