#!/usr/bin/env bash
# The field's rows (docs/field.md) on the shapes worlds at the quality N of record, on a GPU, no
# downloads: every row of +experiment=field that a shapes world runs (raster, SJD, SJD-PAC, SCD, GSD,
# LANTERN++, EAGLE-2, LANTERN, ZipAR-16, MuLo-SD) beside one another. On 2 CPU cores a 1536-prompt
# row takes an estimated 20 minutes (SJD, SCD, GSD) to 80 (SJD-PAC's 64-wide window and tree: per-image
# rates measured at batch 32-64, multiplied out); on an H100/H200-class GPU, minutes (not yet measured).
#
#     bash benchmarks/gpu_field.sh                 # OUT=results/gpu_field/<time>
#     WORLD=x2 bash benchmarks/gpu_field.sh        # the x2 world
#
# 1. quality: benchmarks/mulo_quality.py --prompts 1536 --seed 2 (held out), untimed at batch 256:
#    forwards per image, GenEval with its paired gap to raster, the failure shares, FID/KID against
#    the ground-truth renders and raster from another draw of the image seeds (the metrics' noise);
# 2. speed: the same rows timed at batch 1 on TIMED prompts, 2 repetitions interleaved (the decode
#    speed-up over raster with its interval and the run's timing noise).
# Quote the speed table only from a machine that ran nothing else.
#
# Environment: WORLD (x1 | x2), PROMPTS (1536), TIMED (16), DEVICE (cuda; cpu runs the same
# commands: DEVICE=cpu PROMPTS=2 TIMED=1 checks the script), OUT, PYTHON.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
WORLD=${WORLD:-x1}
OUT=${OUT:-results/gpu_field/$(date +%Y-%m-%d_%H-%M-%S)}
PROMPTS=${PROMPTS:-1536}
TIMED=${TIMED:-16}
DEVICE=${DEVICE:-cuda}
case "$WORLD" in
  x1) MODEL=shapes; WINDOW=() ;;
  x2) MODEL=shapes_x2; WINDOW=(--set decoder.mulo_sd.draft.window=8) ;;  # the x2 world's MuLo-SD window
  *) echo "WORLD must be x1 or x2, got $WORLD" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
if [ "$DEVICE" = cuda ]; then
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_field.sh needs a CUDA GPU')" || exit 1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
fi
ROWS=()
for row in sjd sjd_pac scd gsd lantern_pp eagle2 lantern zipar mulo_sd; do ROWS+=(--variant "$row=$row"); done

echo "=== quality: $MODEL, $PROMPTS prompts, held-out seed 2, batch 256 ($DEVICE)"
"$PY" benchmarks/mulo_quality.py --model "$MODEL" --prompts "$PROMPTS" --seed 2 --batch 256 --fid \
  --device "$DEVICE" --out "$OUT/quality" "${ROWS[@]}" "${WINDOW[@]}" 2>&1 | tail -30 | tee "$OUT/quality.txt"

echo "=== speed: $MODEL, $TIMED prompts at batch 1, 2 repetitions interleaved ($DEVICE)"
"$PY" benchmarks/mulo_quality.py --model "$MODEL" --prompts "$TIMED" --timed "$TIMED" --seed 2 \
  --batch "$TIMED" --device "$DEVICE" --out "$OUT/speed" "${ROWS[@]}" "${WINDOW[@]}" 2>&1 | tail -30 \
  | tee "$OUT/speed.txt"
