#!/usr/bin/env bash
# Wheels for a GPU machine without internet (benchmarks/gpu_first_run.sh): run on a machine with
# internet, in the repository root, then copy the repository (wheelhouse/ included) to the GPU machine:
#
#     bash benchmarks/build_wheelhouse.sh                # -> wheelhouse/
#     PYVER=3.11 bash benchmarks/build_wheelhouse.sh     # wheels for the GPU machine's Python
#
# On the GPU machine (torch with CUDA already installed there):
#
#     pip install --no-index --find-links wheelhouse -r benchmarks/gpu_requirements.txt
#
# Packages: benchmarks/gpu_requirements.txt and their dependencies, never torch. Binary wheels are
# for PLATFORM (manylinux2014_x86_64) and PYVER (this Python's X.Y); antlr4-python3-runtime 4.9.3
# (hydra's parser runtime) is published as a source archive only, so it is built into a wheel here.
# Environment: WHEELHOUSE (wheelhouse), PYTHON, PYVER, PLATFORM.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
DEST=${WHEELHOUSE:-wheelhouse}
PYVER=${PYVER:-$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')}
PLATFORM=${PLATFORM:-manylinux2014_x86_64}
REQS=benchmarks/gpu_requirements.txt
mkdir -p "$DEST"
# The pure-Python source-only package first, as a wheel of its own (no dependencies).
"$PY" -m pip wheel --no-deps --wheel-dir "$DEST" "$(grep -E '^antlr4-python3-runtime' "$REQS")"
# Everything else as published wheels for the target Python and platform (dependencies included).
grep -vE '^(#|$|antlr4-python3-runtime)' "$REQS" > "$DEST/.binary.txt"
"$PY" -m pip download --only-binary=:all: --python-version "$PYVER" --platform "$PLATFORM" \
  --platform manylinux_2_17_x86_64 --platform any --dest "$DEST" -r "$DEST/.binary.txt" \
  antlr4-python3-runtime==4.9.3 --find-links "$DEST"
rm -f "$DEST/.binary.txt"
ls "$DEST" | sed 's/^/  /'
echo "wheelhouse: $(ls "$DEST" | wc -l) wheels in $DEST; on the GPU machine:"
echo "  pip install --no-index --find-links $DEST -r $REQS"
