#!/usr/bin/env bash
# The three wheels the lent GPU image lacks (benchmarks/gpu_first_run.sh): hydra-core, omegaconf and
# antlr4-python3-runtime at the versions harness/data/requirements.lock pins, into the ignored .whl/
# (about 0.4 MB, carried with a device call). Run where there is internet, in the repository root:
#
#     bash benchmarks/build_wheels.sh
#
# hydra-core and omegaconf are published as pure-Python wheels (downloaded, no dependencies: the image
# has PyYAML and packaging); antlr4-python3-runtime 4.9.3 is published as a source archive only, so
# pip builds its wheel here. Environment: PYTHON (python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEST=.whl
pin() { grep -E "^$1==" harness/data/requirements.lock | head -1; }
mkdir -p "$DEST"
rm -f "$DEST"/*.whl
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --dest "$DEST" "$(pin hydra-core)" "$(pin omegaconf)"
"$PY" -m pip wheel --quiet --no-deps --wheel-dir "$DEST" "$(pin antlr4-python3-runtime)"
ls -l "$DEST"/*.whl | awk '{print "  " $NF, $5, "bytes"}'
