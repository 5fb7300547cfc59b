#!/usr/bin/env bash
# The first GPU run of the decode engine (docs/methodology.md, "What the first GPU run answers"): one
# lent GPU, no network, random weights, in exactly two calls of at most 8 minutes each (a session has
# 15 minutes of device time in all, machine start included). Every row is printed as it is measured.
#
#     bash benchmarks/gpu_first_run.sh call1   # steps:llamagen_xl_512 (eager rows first), then syncs
#     bash benchmarks/gpu_first_run.sh call2   # checks: CUDA compiled = eager and batch independence,
#                                              # one test per decoder
#     bash benchmarks/gpu_first_run.sh steps:tar_1.5b_512   # one part alone (checks, syncs, steps:<model>)
#
# The lent image has torch with CUDA, numpy, pandas, PyYAML, pillow, tqdm, safetensors, transformers
# and pytest; hydra-core, omegaconf and antlr4-python3-runtime come as wheels in the ignored .whl/
# (benchmarks/build_wheels.sh, where there is internet), carried with the call and installed here
# into .whl/site (no network, nothing outside the checkout). TINY=1 runs both calls on the CPU at a
# tiny scale (benchmarks/rehearse_gpu_first_run.sh: in a virtualenv of the image's packages alone).
# Environment: OUT (results/gpu_first_run/<time>), PYTHON (python3), SITE (.whl/site), STEPS (64), and the seconds each
# part may take: LIMIT_STEPS (300), LIMIT_SYNCS (120), LIMIT_CHECKS (420); with TINY=1 3x, 5x, 3x.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-results/gpu_first_run/$(date +%Y-%m-%d_%H-%M-%S)}
TINY=${TINY:-0}
LIMIT_STEPS=${LIMIT_STEPS:-300}
LIMIT_SYNCS=${LIMIT_SYNCS:-120}
LIMIT_CHECKS=${LIMIT_CHECKS:-420}
if [ "$TINY" = 1 ]; then  # a shared CPU compiles and decodes far slower than the GPU: limits are generous
  LIMIT_STEPS=$((LIMIT_STEPS * 3)); LIMIT_SYNCS=$((LIMIT_SYNCS * 5)); LIMIT_CHECKS=$((LIMIT_CHECKS * 3))
fi
SITE=${SITE:-.whl/site}   # where the wheels are installed (the rehearsal: a folder of its own)
case $SITE in /*) ;; *) SITE="$PWD/$SITE" ;; esac
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
DECODERS=raster,sjd,eagle2,lantern,zipar,mulo_sd   # conf/config.yaml's default decoders
mkdir -p "$OUT"
if ! "$PY" -c "import hydra, omegaconf" 2>/dev/null; then
  ls .whl/*.whl >/dev/null 2>&1 || {
    echo "hydra-core / omegaconf missing and no wheels in .whl/: run bash benchmarks/build_wheels.sh where there is internet" >&2
    exit 1; }
  "$PY" -m pip install --quiet --no-index --no-deps --target "$SITE" .whl/*.whl || exit 1
fi
if [ "$TINY" = 1 ]; then
  DEVICE=cpu; STEPS=${STEPS:-2}; BATCHES=1; MODELS_OF=llamagen_tiny; THREADS=(--threads 1)
  CHECKS=(-m "not slow" -k "on_cuda or both_host_paths")   # the CUDA tests (one per decoder) skip on the
                                                           # CPU; their CPU counterparts run
else
  DEVICE=cuda; STEPS=${STEPS:-64}; BATCHES=1,16; MODELS_OF=; THREADS=()
  CHECKS=(-m gpu)
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_first_run.sh needs a CUDA GPU (TINY=1: the CPU)')" || exit 1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
fi

part() {  # part NAME: one part under its own time limit, output tee'd to $OUT/NAME.txt
  local name=$1 model
  echo "=== $name ($DEVICE)"
  case $name in
    checks)
      timeout "$LIMIT_CHECKS" "$PY" -m pytest -v -p no:cacheprovider "${CHECKS[@]}" tests/test_engine.py 2>&1 \
        | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|error" ;;
    syncs)
      timeout "$LIMIT_SYNCS" "$PY" -u benchmarks/engine.py --device "$DEVICE" --tables dispatch \
        --decoders "$DECODERS" "${THREADS[@]}" 2>&1 ;;
    steps:*)
      model=${MODELS_OF:-${name#steps:}}
      timeout "$LIMIT_STEPS" "$PY" -u benchmarks/engine.py --device "$DEVICE" --tables steps --models "$model" \
        --batches "$BATCHES" --steps "$STEPS" "${THREADS[@]}" 2>&1 ;;
    *) echo "unknown part $name: call1, call2, checks, syncs, steps:<model>" >&2; return 2 ;;
  esac | tee "$OUT/${name//:/_}.txt"
  return "${PIPESTATUS[0]}"
}

status=0
[ $# -gt 0 ] || { echo "usage: bash benchmarks/gpu_first_run.sh call1 | call2 | PART..." >&2; exit 2; }
for name in "$@"; do
  case $name in
    call1) for p in steps:llamagen_xl_512 syncs; do part "$p" || status=$?; done ;;
    call2) part checks || status=$? ;;
    *) part "$name" || status=$? ;;
  esac
done
echo "outputs: $OUT"
exit "$status"
