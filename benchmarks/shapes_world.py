"""Quality report of the shipped shapes world, per GenEval tag:

1. detector accuracy (share of images whose own caption passes GenEval's rules) on ground-truth
   renders and on tokenizer reconstructions, at the target's size (64 px; x2 world 128 px) and the
   drafter's (32 px; x2 world 64 px);
2. shapes-GenEval of raster samples from the target (with and without CFG) and from the drafter;
3. drafter-target agreement: the drafter's samples up-sampled to the target grid (decode ->
   nearest resize -> encode), teacher-forced through the target: mean target probability of the
   up-sampled draft tokens and the share where the draft token is the target's argmax;
4. per MuLo-SD up-sampler (baselines/upsamplers.py: pixel bicubic / nearest, token replication,
   the learned ones shipped for the target's grid): shapes-GenEval of the drafter's samples
   up-sampled (what tau = 0 keeps), and the share of their tokens that the pooled-threshold rule
   would reject, teacher-forced through the CFG-guided target, at k in POOL_K and tau in POOL_TAU
   (baselines/pooled.py). The drafter's samples are drawn serially (raster order).

    python benchmarks/shapes_world.py [--world x1|x2] [--prompts 96] [--cfg 3.0] [--threads 2]
"""
from __future__ import annotations

import argparse
from collections import defaultdict
from typing import Sequence

import numpy as np
import torch

from baselines.canvas import Context
from baselines.pooled import pooled_mass
from baselines.raster import RasterDecoder
from baselines.upsamplers import build_upsampler, resize_images, shipped_weights
from evaluators.geneval import ShapesBackend
from evaluators.geneval_rules import GenEvalRules
from harness.api import ModelBundle, Prompt, SamplingParams
from harness.datasets.prompts import shapes
from baselines.neighbours import neighbour_table
from harness.run import guided
from harness.sampling import probs
from harness.seeding import image_seed
from harness.shapes.bundle import load
from harness.shapes.scenes import render, scene_for_caption
from harness.shapes.weights import WORLDS

TAGS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
UPSAMPLERS = {  # label -> build_upsampler keys
    "pixel bicubic": {"kind": "pixel", "mode": "bicubic"},
    "pixel nearest": {"kind": "pixel", "mode": "nearest"},
    "token replication": {"kind": "nearest"},
    "learned ce": {"kind": "learned", "objective": "ce"},
    "learned pixel": {"kind": "learned", "objective": "pixel"},
    "learned gan": {"kind": "learned", "objective": "gan"},
}
POOL_K = (1, 16, 64)
POOL_TAU = (0.1, 1e-3)


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


@torch.inference_mode()
def guided_probs(bundle: ModelBundle, prompts: Sequence[Prompt], tokens: torch.Tensor, cfg: float) -> torch.Tensor:
    """Teacher-forced target distributions as MuLo-SD's verification sees them (the CFG-wrapped
    target, harness.sampling.probs at temperature 1): tokens [N, L] -> p [N, L, V], where p[:, i]
    is the distribution of token i given tokens[:, :i]."""
    params = SamplingParams(cfg_scale=cfg)
    models = guided(bundle, params)
    target = models.target
    target.setup_cache(len(tokens))
    first = target.prefill(models.condition([p.text for p in prompts]))[:, None]  # predicts position 0
    rest = target.forward(tokens[:, :-1], torch.arange(tokens.shape[1] - 1))
    return probs(torch.cat([first, rest], 1), params)


def rejected_shares(p: torch.Tensor, tokens: torch.Tensor, codebook: torch.Tensor) -> dict[str, float]:
    """p [N, L, V], draft tokens [N, L] -> {"k=K tau=T": share of tokens with pooled mass < T}."""
    out = {}
    for k in POOL_K:
        mass = pooled_mass(p, tokens, neighbour_table(codebook, k - 1) if k > 1 else None)
        out.update({f"k={k} tau={tau:g}": float((mass < tau).float().mean()) for tau in POOL_TAU})
    return out


@torch.inference_mode()
def upsampler_rows(bundle: ModelBundle, prompts: Sequence[Prompt], low: torch.Tensor, cfg: float
                   ) -> dict[str, dict[str, float]]:
    """Drafter tokens low [N, n_low] -> {up-sampler: GenEval overall of the up-sampled draft and
    its rejected shares}; learned up-samplers without weights for this grid are skipped."""
    ctx = Context(models=bundle, cond=None, sampling=SamplingParams(cfg_scale=cfg), gens=[],  # type: ignore[arg-type]
                  device=torch.device("cpu"))
    rows = {}
    for name, keys in UPSAMPLERS.items():
        if keys["kind"] == "learned" and not shipped_weights(keys["objective"], ctx.grid).is_file():
            print(f"{name}: skipped (no weights shipped for a {ctx.grid[0]}x{ctx.grid[1]} grid)")
            continue
        high = build_upsampler(**keys).up(low.view(len(low), *bundle.drafter.grid), ctx).flatten(1)
        p = guided_probs(bundle, prompts, high, cfg)
        images = bundle.target.decode(high).permute(0, 2, 3, 1).numpy()
        rows[name] = {"geneval": score(images, prompts)["overall"],
                      **rejected_shares(p, high, bundle.target.codebook)}
    return rows


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
    low = raster_tokens(bundle, prompts, a.cfg, drafter=True)
    draft = bundle.drafter.decode(low).permute(0, 2, 3, 1).numpy()
    print(row(f"drafter raster cfg={a.cfg} ({small}px)", score(draft, prompts)))
    print("drafter -> target agreement:", {k: round(v, 3) for k, v in agreement(bundle, prompts, draft).items()})
    shares = upsampler_rows(bundle, prompts, low, a.cfg)
    keys = [f"k={k} tau={tau:g}" for k in POOL_K for tau in POOL_TAU]
    print(f"\nup-sampled drafts ({big}px): GenEval, and the share of draft tokens the guided target "
          f"(cfg {a.cfg}) gives a pooled mass below tau")
    print(f"{'up-sampler':<20}{'geneval':>8}" + "".join(f"{k:>16}" for k in keys))
    for name, values in shares.items():
        print(f"{name:<20}{values['geneval']:>8.3f}" + "".join(f"{values[k]:>16.4f}" for k in keys))


if __name__ == "__main__":
    main()
