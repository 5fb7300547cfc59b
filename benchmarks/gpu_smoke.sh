#!/usr/bin/env bash
# GPU smoke test of the real models (issue 7): raster vs MuLo-SD on 8 COCO prompts for LlamaGen-XL
# 512 px (drafter: stage-1 256 px) and Tar-1.5B 512 px (drafter: AR-DTok 256 px), one pipeline run
# per model (interleaved, repeated timing with CUDA events; docs/methodology.md); prints the runs'
# summary table (`python -m harness.results`: latency, end-to-end latency, speed-up with its 95%
# interval, timing_noise, peak GPU memory). Ready to run unchanged on a CUDA machine:
#
#     bash benchmarks/gpu_smoke.sh            # OUT=..., PROMPTS=8, REPS=2, DECODERS=[raster,mulo_sd]
#
# Needs: one CUDA GPU with >= 24 GB, `pip install -e . transformers sentencepiece`, and either
# internet (weights go to the Hugging Face cache, ~25 GB: peizesun/llamagen_t2i 3 files 3.4 GB,
# google/flan-t5-xl 11 GB, csuhan/TA-Tok 3 files ~5 GB, csuhan/Tar-1.5B 3.5 GB) or a pre-filled
# cache (HF_HOME=..., HF_HUB_OFFLINE=1; pre-download with `hf download REPO [FILE]`).
# COCO captions come from the pinned coco5k dataset (conf/dataset/coco5k.yaml).
#
# Expected cost (H100/A100 80 GB, bf16, batch 1, estimates, not yet measured): LlamaGen-XL 512 raster
# ~15-25 s per image (1024 steps, CFG batch 2), Tar-1.5B: LLM stage ~15-20 s per prompt plus
# AR-DTok 512 ~15-25 s per image; 1 warm-up + 8 images x REPS decodes per decoder and model: ~30-60 min
# in all after the downloads at REPS=2. Peak GPU memory: ~10 GB for LlamaGen (two GPT-XL + T5-XL encoder in bf16),
# ~9 GB for Tar-1.5B (Qwen2.5-1.5B + TA-Tok decode path + two AR-DTok), plus KV caches (< 1 GB).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
OUT=${OUT:-results/gpu_smoke/$(date +%Y-%m-%d_%H-%M-%S)}
PROMPTS=${PROMPTS:-8}
DECODERS=${DECODERS:-[raster,mulo_sd]}
REPS=${REPS:-2}
MODELS=${MODELS:-"llamagen_xl_512 tar_1.5b_512"}

"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_smoke.sh needs a CUDA GPU')"
"$PY" -c "import transformers" 2>/dev/null || { echo "gpu_smoke.sh needs transformers: pip install transformers sentencepiece" >&2; exit 1; }

for model in $MODELS; do
  echo "=== $model: $DECODERS on $PROMPTS COCO prompts -> $OUT/$model"
  "$PY" -m harness name="gpu_smoke" model="$model" decoder="$DECODERS" dataset=coco5k \
    dataset_limit="$PROMPTS" batch_size=1 warmup_batches=1 timing.reps="$REPS" device=cuda evaluator=[speed] \
    hydra.run.dir="$OUT/$model"
done

"$PY" -m harness.results "$OUT"
