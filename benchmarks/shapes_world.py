"""Quality report of the shipped shapes world, per GenEval tag:

1. detector accuracy (share of images whose own caption passes GenEval's rules) on ground-truth
   renders and on tokenizer reconstructions, at the target's size (64 px; x2 world 128 px) and the
   drafter's (32 px; x2 world 64 px);
2. shapes-GenEval of raster samples from the target (with and without CFG) and from the drafter,
   and of the drafter's samples up-sampled to the target's size (bicubic and nearest resize, each
   re-encoded: what MuLo-SD's pixel up-sampler proposes);
3. drafter-target agreement: the drafter's samples up-sampled to the target grid (decode ->
   nearest resize -> encode), teacher-forced through the target: mean target probability of the
   up-sampled draft tokens and the share where the draft token is the target's argmax.

    python benchmarks/shapes_world.py [--world x1|x2] [--prompts 96] [--cfg 3.0] [--threads 2]
"""
from __future__ import annotations

import argparse
from collections import defaultdict
from typing import Sequence

import numpy as np
import torch

from baselines.raster import RasterDecoder
from baselines.upsamplers import resize_images
from evaluators.geneval import ShapesBackend
from evaluators.geneval_rules import GenEvalRules
from harness.api import ModelBundle, Prompt, SamplingParams
from harness.datasets import shapes
from harness.run import guided
from harness.seeding import image_seed
from harness.shapes.bundle import load
from harness.shapes.scenes import render, scene_for_caption
from harness.shapes.weights import WORLDS

TAGS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")


def score(images: np.ndarray, prompts: Sequence[Prompt]) -> dict[str, float]:
    """images [N, H, W, 3] uint8 -> per-tag accuracy and the overall mean of tags."""
    rules, per = GenEvalRules(), defaultdict(list)
    for dets, p in zip(ShapesBackend().detect(list(images)), prompts):
        per[p.meta["tag"]].append(rules.evaluate(dets, p.meta)[0])
    out = {t: float(np.mean(per[t])) for t in TAGS if per[t]}
    out["overall"] = float(np.mean(list(out.values())))
    return out


def ground_truth(prompts: Sequence[Prompt], size: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.stack([render(scene_for_caption(p.meta, rng), size) for p in prompts])


@torch.inference_mode()
def reconstruct(bundle: ModelBundle, images: np.ndarray) -> np.ndarray:
    tok = bundle.target.tokenizer  # type: ignore[attr-defined]
    x = torch.from_numpy(images).permute(0, 3, 1, 2)
    return tok.decode(tok.encode(x)).permute(0, 2, 3, 1).numpy()


@torch.inference_mode()
def raster_tokens(bundle: ModelBundle, prompts: Sequence[Prompt], cfg: float, drafter: bool) -> torch.Tensor:
    params = SamplingParams(temperature=1.0, cfg_scale=cfg)
    models = guided(bundle, params)
    if drafter:
        models = ModelBundle(name="drafter", target=models.drafter, conditioner=models.conditioner)
    seeds = [image_seed(0, p.id, 0) for p in prompts]
    return RasterDecoder(params).generate(models, models.condition([p.text for p in prompts]), seeds).tokens


@torch.inference_mode()
def upsampled(bundle: ModelBundle, draft_images: np.ndarray, mode: str) -> np.ndarray:
    """Drafter images [N, h, w, 3] -> resized to the target's size with `mode`, encoded and decoded
    by the target's tokenizer [N, H, W, 3] (the pixel up-sampler's proposal)."""
    size = bundle.target.grid[0] * 4
    x = resize_images(torch.from_numpy(draft_images).permute(0, 3, 1, 2), (size, size), mode)
    return reconstruct(bundle, x.permute(0, 2, 3, 1).numpy())


@torch.inference_mode()
def agreement(bundle: ModelBundle, prompts: Sequence[Prompt], draft_images: np.ndarray) -> dict[str, float]:
    """Teacher-force the up-sampled drafts through the (unguided) target."""
    size = bundle.target.grid[0] * 4
    up = resize_images(torch.from_numpy(draft_images).permute(0, 3, 1, 2), (size, size), "nearest")
    tokens = bundle.target.encode(up)  # [N, grid^2]
    gpt = bundle.target.gpt  # type: ignore[attr-defined]
    cond = bundle.condition([p.text for p in prompts])
    p = gpt.forward_train(cond, tokens).softmax(-1)  # [N, grid^2, V]
    p_draft = p.gather(-1, tokens[..., None])[..., 0]
    return {"mean_p_target(draft)": float(p_draft.mean()),
            "argmax_match": float((p.argmax(-1) == tokens).float().mean())}


def row(name: str, scores: dict[str, float]) -> str:
    return f"{name:<34}" + " ".join(f"{scores.get(t, float('nan')):>8.3f}" for t in (*TAGS, "overall"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=96)
    ap.add_argument("--cfg", type=float, default=3.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--weights", default=None, help="weights folder (default: the shipped weights)")
    ap.add_argument("--world", default="x1", choices=sorted(WORLDS), help="x2: the 32x32 world (model=shapes_x2)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    prompts, bundle = shapes(a.prompts), load(a.weights, small_drafter=False, world=a.world)
    big, small = bundle.target.grid[0] * 4, bundle.drafter.grid[0] * 4
    print(f"{a.prompts} prompts ({a.prompts // 6} per tag)")
    print(f"{'':<34}" + " ".join(f"{t[:8]:>8}" for t in (*TAGS, "overall")))
    for size in (big, small):
        gt = ground_truth(prompts, size)
        print(row(f"detector on ground truth {size}px", score(gt, prompts)))
        print(row(f"detector on reconstructions {size}px", score(reconstruct(bundle, gt), prompts)))
    for cfg in (1.0, a.cfg):
        t = raster_tokens(bundle, prompts, cfg, drafter=False)
        print(row(f"target raster cfg={cfg}", score(bundle.target.decode(t).permute(0, 2, 3, 1).numpy(), prompts)))
    draft = bundle.drafter.decode(raster_tokens(bundle, prompts, a.cfg, drafter=True)).permute(0, 2, 3, 1).numpy()
    print(row(f"drafter raster cfg={a.cfg} ({small}px)", score(draft, prompts)))
    for mode in ("bicubic", "nearest"):
        print(row(f"  up-sampled {mode} ({big}px)", score(upsampled(bundle, draft, mode), prompts)))
    print("drafter -> target agreement:", {k: round(v, 3) for k, v in agreement(bundle, prompts, draft).items()})


if __name__ == "__main__":
    main()
