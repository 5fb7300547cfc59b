#!/usr/bin/env bash
# The CPU rehearsal of the first GPU run's two device calls (benchmarks/gpu_first_run.sh call1, call2,
# TINY=1): in a fresh virtualenv that has only the lent image's packages (benchmarks/image_venv.py),
# each call installing the carried wheels from .whl/ into a folder of its own, as on a fresh device
# machine. Prints each call's wall time. .ci/run runs it; run it from the project's environment:
#
#     PYTHON=.venv/bin/python bash benchmarks/rehearse_gpu_first_run.sh
#
# .whl/ is built first when it holds no wheel (benchmarks/build_wheels.sh: needs internet).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
ls .whl/*.whl >/dev/null 2>&1 || bash benchmarks/build_wheels.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
image_python=$("$PY" benchmarks/image_venv.py "$tmp/venv" | tail -1)
for call in call1 call2; do
  start=$(date +%s)
  SITE="$tmp/site_$call" TINY=1 PYTHON="$image_python" OUT="$tmp/out_$call" OMP_NUM_THREADS=1 \
    bash benchmarks/gpu_first_run.sh "$call"
  echo "rehearsed $call in $(( $(date +%s) - start )) s"
done
