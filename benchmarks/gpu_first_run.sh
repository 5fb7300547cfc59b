#!/usr/bin/env bash
# The first GPU run of the decode engine (docs/methodology.md, "What the first GPU run answers"): one
# GPU (an H200 here), no network, random weights, about 15 minutes of device time in all, in parts
# of at most 8 minutes each that run separately; every row is printed as it finishes.
#
#     pip install --no-index --find-links wheelhouse -r benchmarks/gpu_requirements.txt  # once, offline
#     bash benchmarks/gpu_first_run.sh checks          # compiled = eager greedy, batch independence (CUDA)
#     bash benchmarks/gpu_first_run.sh syncs           # host reads and CUDA syncs per step, per decoder
#     bash benchmarks/gpu_first_run.sh steps:llamagen_xl_512   # eager / compiled ms per raster step vs
#     bash benchmarks/gpu_first_run.sh steps:tar_1.5b_512      # the floor at batch 1 and 16, compile
#     bash benchmarks/gpu_first_run.sh steps:tar_7b_1024       # time apart (one model a part)
#     bash benchmarks/gpu_first_run.sh all             # every part in turn (> 8 minutes: not one command)
#
# wheelhouse/ comes from benchmarks/build_wheelhouse.sh (run where there is internet). TINY=1 runs
# the same parts on the CPU at a tiny scale (tests/test_benchmark_scripts.py does, so the script is
# known to work before a GPU sees it). Environment: OUT (results/gpu_first_run/<time>), PYTHON,
# LIMIT (seconds per part, 470), STEPS (64).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-results/gpu_first_run/$(date +%Y-%m-%d_%H-%M-%S)}
LIMIT=${LIMIT:-470}
TINY=${TINY:-0}
mkdir -p "$OUT"
if [ "$TINY" = 1 ]; then
  DEVICE=cpu; STEPS=${STEPS:-2}; BATCHES=1; MODELS_OF=llamagen_tiny; THREADS=(--threads 1)
else
  DEVICE=cuda; STEPS=${STEPS:-64}; BATCHES=1,16; MODELS_OF=; THREADS=()
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_first_run.sh needs a CUDA GPU (TINY=1: the CPU)')" || exit 1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
fi
"$PY" -c "import hydra, omegaconf, pandas" 2>/dev/null || {
  echo "missing packages: pip install --no-index --find-links wheelhouse -r benchmarks/gpu_requirements.txt" >&2; exit 1; }

part() {  # part NAME: one part, at most LIMIT seconds, output tee'd to $OUT/NAME.txt
  local name=$1 model
  echo "=== $name ($DEVICE)"
  case $name in
    checks)
      timeout "$LIMIT" "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/test_engine.py 2>&1 | tail -20 ;;
    syncs)
      timeout "$LIMIT" "$PY" -u benchmarks/engine.py --device "$DEVICE" --tables dispatch "${THREADS[@]}" 2>&1 ;;
    steps:*)
      model=${MODELS_OF:-${name#steps:}}
      timeout "$LIMIT" "$PY" -u benchmarks/engine.py --device "$DEVICE" --tables steps --models "$model" \
        --batches "$BATCHES" --steps "$STEPS" "${THREADS[@]}" 2>&1 ;;
    *) echo "unknown part $name: checks, syncs, steps:<model>, all" >&2; return 2 ;;
  esac | tee "$OUT/${name//:/_}.txt"
  return "${PIPESTATUS[0]}"
}

status=0
for name in "${@:-all}"; do
  if [ "$name" = all ]; then
    for p in checks syncs steps:llamagen_xl_512 steps:tar_1.5b_512 steps:tar_7b_1024; do part "$p" || status=$?; done
  else
    part "$name" || status=$?
  fi
done
echo "outputs: $OUT"
exit "$status"
