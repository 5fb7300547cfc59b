#!/usr/bin/env bash
# Build the environment an official evaluator runs its scripts in (docs/evaluators.md). Run through
# `python -m evaluators.official_build geneval|dpg_bench [HOME]` (installed: `mulo-bench-official-env`),
# which finds this file in the installed package:
#
#   geneval     evaluator=geneval_official   (protocol=geneval)
#   dpg_bench   evaluator=dpg_bench_official (protocol=dpg_bench)
#
# into HOME (second argument; default $MULO_BENCH_CACHE/official/<name>, ~/.cache/mulo_bench/official/<name>),
# where the evaluator looks by default: HOME/repo is the official repository at its pinned commit,
# HOME/env a conda environment (HOME/env/bin/python) installed under <name>.constraints.txt beside this file.
# The files the scripts read (GenEval's detector and CLIP file, DPG-Bench's mPLUG) are then brought by
# `stages=[fetch]`. Needs git and conda (CONDA_EXE, else `conda` on PATH); geneval also compiles mmcv-full's
# CUDA operators: a CUDA toolkit in CUDA_HOME (11.3 for torch 1.12, 11.8 on Hopper) and TORCH_CUDA_ARCH_LIST
# set to the GPU's compute capability (8.0: A100, 9.0: H100 / H200). Rerunning it resumes.
set -euo pipefail
name=${1:-}
here=$(cd "$(dirname "$0")" && pwd)
case $name in
    geneval) url=https://github.com/djghosh13/geneval.git; commit=af4902f24d3ca90ebbb446dd9891a59e0f82725f ;;
    dpg_bench) url=https://github.com/TencentQQGYLab/ELLA.git; commit=3c228f1dc6c4d3cad0a47493816151a419f14db3 ;;
    *) echo "error: give the environment to build: python -m evaluators.official_build geneval|dpg_bench [HOME]" >&2; exit 2 ;;
esac
home=${2:-${MULO_BENCH_CACHE:-$HOME/.cache/mulo_bench}/official/$name}
constraints=$here/$name.constraints.txt
conda=${CONDA_EXE:-conda}
env=$home/env
pip=("$env/bin/python" -m pip)
mkdir -p "$home"
[ -d "$home/repo/.git" ] || git clone -q "$url" "$home/repo"
git -C "$home/repo" fetch -q origin "$commit" 2>/dev/null || true
git -C "$home/repo" checkout -q "$commit"

if [ "$name" = geneval ]; then
    arch=${TORCH_CUDA_ARCH_LIST:?set TORCH_CUDA_ARCH_LIST to the GPU\'s compute capability, e.g. 8.0 (A100) or 9.0 (H100)}
    [ -x "$env/bin/python" ] || "$conda" env create -q -f "$home/repo/environment.yml" -p "$env"
    mmcv=1.7.1
    if [ "${arch%%.*}" -ge 9 ]; then  # torch 1.12 + CUDA 11.3 has no sm_90 kernels: the first torch built with CUDA 11.8
        "${pip[@]}" install -q torch==2.0.1 torchvision==0.15.2 --index-url https://download.pytorch.org/whl/cu118
        mmcv=1.7.2
    fi
    "${pip[@]}" uninstall -q -y mmcv-full || true
    MMCV_WITH_OPS=1 FORCE_CUDA=1 "${pip[@]}" install -q --no-cache-dir --no-build-isolation --no-binary mmcv-full \
        "mmcv-full==$mmcv"
    [ -d "$home/mmdetection/.git" ] || git clone -q -b v2.28.2 https://github.com/open-mmlab/mmdetection.git \
        "$home/mmdetection"
    "${pip[@]}" install -q -c "$constraints" -e "$home/mmdetection"
    "$env/bin/python" -c "from mmcv.ops import MultiScaleDeformableAttention; import mmdet, clip_benchmark, open_clip
assert open_clip.__version__ == '2.20.0', open_clip.__version__"
else
    [ -x "$env/bin/python" ] || "$conda" create -q -y -p "$env" python=3.10
    "${pip[@]}" install -q "pip<24.1"  # fairseq's omegaconf 2.0 has metadata newer pips refuse
    # a torch built for the node's driver (DPG_TORCH_INDEX: another CUDA build of the same version)
    "${pip[@]}" install -q torch==2.1.2 torchvision==0.16.2 \
        --index-url "${DPG_TORCH_INDEX:-https://download.pytorch.org/whl/cu118}"
    "${pip[@]}" install -q -c "$constraints" -r "$home/repo/requirements-for-dpg_bench.txt"
    "$env/bin/python" -c "import accelerate, fairseq, modelscope"
fi
echo "built $env (python: $env/bin/python), $home/repo at $commit; now fetch what it reads with stages=[fetch]"
