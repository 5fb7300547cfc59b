#!/usr/bin/env bash
# GPU smoke test of the real models (issue 7): raster vs MuLo-SD on 8 COCO prompts for LlamaGen-XL
# 512 px (drafter: stage-1 256 px) and Tar-1.5B 512 px (drafter: AR-DTok 256 px); prints the
# speed-up and peak GPU memory of each. Ready to run unchanged on a CUDA machine:
#
#     bash benchmarks/gpu_smoke.sh            # OUT=..., PROMPTS=8, DECODERS=[raster,mulo_sd]
#
# Needs: one CUDA GPU with >= 24 GB, `pip install -e . transformers sentencepiece`, and either
# internet (weights go to the Hugging Face cache, ~25 GB: peizesun/llamagen_t2i 3 files 3.4 GB,
# google/flan-t5-xl 11 GB, csuhan/TA-Tok 3 files ~5 GB, csuhan/Tar-1.5B 3.5 GB) or a pre-filled
# cache (HF_HOME=..., HF_HUB_OFFLINE=1; pre-download with `huggingface-cli download REPO [FILE]`).
# COCO captions come from the pinned coco5k dataset (conf/dataset/coco5k.yaml).
#
# Expected cost (H100/A100 80 GB, bf16, batch 1, estimates, not yet measured): LlamaGen-XL 512 raster
# ~15-25 s per image (1024 steps, CFG batch 2), Tar-1.5B: LLM stage ~15-20 s per prompt plus
# AR-DTok 512 ~15-25 s per image; 9 images (1 warm-up) per decoder and model: ~15-30 min in all
# after the downloads. Peak GPU memory: ~10 GB for LlamaGen (two GPT-XL + T5-XL encoder in bf16),
# ~9 GB for Tar-1.5B (Qwen2.5-1.5B + TA-Tok decode path + two AR-DTok), plus KV caches (< 1 GB).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
OUT=${OUT:-results/gpu_smoke/$(date +%Y-%m-%d_%H-%M-%S)}
PROMPTS=${PROMPTS:-8}
DECODERS=${DECODERS:-[raster,mulo_sd]}
MODELS=${MODELS:-"llamagen_xl_512 tar_1.5b_512"}

"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_smoke.sh needs a CUDA GPU')"
"$PY" -c "import transformers" 2>/dev/null || { echo "gpu_smoke.sh needs transformers: pip install transformers sentencepiece" >&2; exit 1; }

for model in $MODELS; do
  echo "=== $model: $DECODERS on $PROMPTS COCO prompts -> $OUT/$model"
  "$PY" -m harness name="gpu_smoke" model="$model" decoder="$DECODERS" dataset=coco5k \
    dataset_limit="$PROMPTS" batch_size=1 warmup_batches=1 device=cuda evaluator=[speed] \
    hydra.run.dir="$OUT/$model"
done

"$PY" - "$OUT" $MODELS <<'PYEOF'
import sys
from pathlib import Path

import pandas as pd

out, models = Path(sys.argv[1]), sys.argv[2:]
for model in models:
    s = pd.read_csv(out / model / "summary.csv")
    s = s[s.subset == "all"]
    pick = lambda metric: s[s.metric == metric].set_index("decoder").value  # noqa: E731
    lat, cond, mem = pick("latency_s"), pick("condition_s"), pick("peak_memory_mb")
    speed = pick("speedup_vs_raster")
    for dec in lat.index:
        full = (lat["raster"] + cond.get("raster", 0.0)) / (lat[dec] + cond.get(dec, 0.0)) if "raster" in lat else float("nan")
        print(f"{model:16s} {dec:10s} latency {lat[dec]:8.2f} s  condition {cond.get(dec, float('nan')):6.2f} s  "
              f"speed-up (decode stage) {speed.get(dec, float('nan')):5.2f}x  (with condition stage) {full:5.2f}x  "
              f"peak {mem.get(dec, float('nan')):8.0f} MB")
PYEOF
