#!/usr/bin/env bash
# EAGLE-2 and LANTERN on the x2 shapes world at the issue's quality N, on a GPU (a few minutes on an
# H100/H200-class GPU; 1.4 to 1.7 CPU-hours per tree row on 2 cores), no downloads:
#
#     bash benchmarks/gpu_trees.sh             # OUT=results/gpu_trees/<time>
#
# 1. benchmarks/mulo_quality.py --model shapes_x2 --prompts 1536 --seed 2 on CUDA: raster, eagle2,
#    LANTERN at k 32, delta 0.4, on_reject pooled (the shapes operating point) and LANTERN's own
#    setting (k 1000, delta 0.4), untimed at batch 256: forwards per image, GenEval and its paired
#    gap to raster, the share of images missing an object; FID/KID with --fid (FID=1).
# 2. the same rows timed at batch 1 on 16 prompts (the speed-up over raster with its interval).
#
# Environment: PROMPTS (1536), TIMED (16), FID=1, DEVICE (cuda; cpu runs the same commands, e.g.
# DEVICE=cpu PROMPTS=2 TIMED=1 to check the script), OUT, PYTHON.
#
# Images drawn on CUDA are not the CPU's (another device, other float rounding), so the SampleSets
# are the run's own (their binding records the device type). Needs: one CUDA GPU, `pip install -e .`.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
OUT=${OUT:-results/gpu_trees/$(date +%Y-%m-%d_%H-%M-%S)}
PROMPTS=${PROMPTS:-1536}
TIMED=${TIMED:-16}
DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT"
if [ "$DEVICE" = cuda ]; then
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_trees.sh needs a CUDA GPU')" || exit 1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
fi
ROWS=(--variant eagle2=eagle2
      --variant lantern_k32p=lantern:accept.k=32,accept.delta=0.4,accept.on_reject=pooled
      --variant lantern=lantern:accept.k=1000,accept.on_reject=neighbourhood)  # the paper's setting (the x2 world's own is k 32 pooled)
FID_FLAG=()
[ "${FID:-0}" = 1 ] && FID_FLAG=(--fid)

echo "=== quality: x2, $PROMPTS prompts, held-out seed 2, batch 256 ($DEVICE)"
timeout 420 "$PY" benchmarks/mulo_quality.py --model shapes_x2 --prompts "$PROMPTS" --seed 2 --batch 256 \
  --device "$DEVICE" --out "$OUT/quality" "${ROWS[@]}" "${FID_FLAG[@]}" 2>&1 | tail -30 | tee "$OUT/quality.txt"

echo "=== speed: x2, $TIMED prompts at batch 1, 2 repetitions interleaved ($DEVICE)"
timeout 240 "$PY" benchmarks/mulo_quality.py --model shapes_x2 --prompts "$TIMED" --timed "$TIMED" --seed 2 \
  --batch "$TIMED" --device "$DEVICE" --out "$OUT/speed" "${ROWS[@]}" 2>&1 | tail -30 | tee "$OUT/speed.txt"
