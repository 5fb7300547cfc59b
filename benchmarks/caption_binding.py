"""Does a shapes-world GPT read word order? Teacher-forced nats of a rendered scene under its own
caption against its word-swapped twin:

    color_attr  "a photo of a red circle and a blue square"  vs  "... a blue circle and a red square"
    position    "a photo of a circle left of a square"       vs  "... a square left of a circle"

A model that reads the caption as a bag of words scores both alike (gap ~0 nats, preferred ~0.5);
one that binds colours to shapes and subjects to relations prefers the true caption.

    python benchmarks/caption_binding.py --named-order         # the shipped target and drafter
    python benchmarks/caption_binding.py --gpt a.safetensors b.safetensors

`--named-order` lays two-object scenes out as models trained with `named_order` (the shipped
ones) saw them; without it the color_attr scenes are half out of their training layout.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from harness.models.condition import TextCondition
from harness.models.gpt import GPT
from harness.shapes.captions import ENCODINGS, TWIN_TAGS, sample_meta, twin
from harness.shapes.scenes import render, scene_for_caption
from harness.shapes.train_gpt import DOWNSAMPLE, caption_encoding
from harness.shapes.vq import ShapesVQ, load_tokenizer
from harness.shapes.weights import WEIGHTS_DIR, load_gpt



@torch.no_grad()
def nats(gpt: GPT, captions: list[str], tokens: torch.Tensor) -> torch.Tensor:
    """Per-image teacher-forced negative log-likelihood [N] of tokens [N, T] under captions [N]."""
    device = gpt.output.weight.device
    tokenize = ENCODINGS[caption_encoding(gpt)][0]
    cond = TextCondition(null=torch.zeros(len(captions), dtype=torch.bool), ids=tokenize(captions)).to(device)
    tokens = tokens.to(device)
    logits = gpt.forward_train(cond, tokens)
    return F.cross_entropy(logits.transpose(1, 2), tokens, reduction="none").sum(1).cpu()


def binding(gpt: GPT, tokenizer: ShapesVQ, scenes: int = 256, seed: int = 0,
            named_order: bool = False) -> dict[str, dict[str, float]]:
    """Per tag: mean nats under the true and the twin caption, their gap, and the fraction of
    scenes whose true caption is more likely."""
    size = gpt.cfg.grid[0] * DOWNSAMPLE
    out = {}
    for i, tag in enumerate(TWIN_TAGS):
        rng = np.random.default_rng([seed, i])
        metas = [sample_meta(tag, rng) for _ in range(scenes)]
        images = np.stack([render(scene_for_caption(m, rng, named_order), size) for m in metas])
        tokens = tokenizer.encode(torch.from_numpy(images).permute(0, 3, 1, 2)).flatten(1)
        true = nats(gpt, [m["prompt"] for m in metas], tokens)
        swapped = nats(gpt, [twin(m)["prompt"] for m in metas], tokens)
        out[tag] = {"true": float(true.mean()), "twin": float(swapped.mean()),
                    "gap": float((swapped - true).mean()), "preferred": float((swapped > true).float().mean())}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpt", nargs="*", type=Path, default=None,
                    help="GPT safetensors files (default: the shipped target and drafter)")
    ap.add_argument("--tokenizer", type=Path, default=WEIGHTS_DIR / "tokenizer.safetensors")
    ap.add_argument("--scenes", type=int, default=256, help="scenes per tag")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--named-order", action="store_true",
                    help="lay two-object scenes out in the caption's order (scenes.scene_for_caption), "
                         "as models trained with named_order saw them")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    files = a.gpt or [WEIGHTS_DIR / "target.safetensors", WEIGHTS_DIR / "drafter.safetensors"]
    tokenizer = load_tokenizer(a.tokenizer)
    print(f"{'model':<40} {'tag':<11} {'true':>7} {'twin':>7} {'gap':>6} {'preferred':>9}")
    for path in files:
        for tag, r in binding(load_gpt(path).eval(), tokenizer, a.scenes, named_order=a.named_order).items():
            print(f"{str(path)[-40:]:<40} {tag:<11} {r['true']:7.2f} {r['twin']:7.2f} {r['gap']:6.2f} "
                  f"{r['preferred']:9.3f}")


if __name__ == "__main__":
    main()
