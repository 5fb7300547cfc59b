"""The shapes world's drafts seen by its target (benchmarks/shapes_world.py, items 3 and 4): the
drafter's raster samples, how the target scores them once up-sampled (agreement, the share the
pooled-threshold rule would reject per up-sampler) and how GenEval judges the up-sampled drafts.
These are properties of the world's models and up-samplers, not a decoder comparison; nothing is
timed, and images are judged by the geneval_shapes evaluator of conf/evaluator/.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from baselines.framework.canvas import Context
from baselines.framework.neighbours import neighbour_table
from baselines.methods.pooled import pooled_mass
from baselines.methods.raster import RasterDecoder
from baselines.methods.upsamplers import build_upsampler, resize_images, shipped_weights
from benchmarks.common import compose_config
from evaluators.geneval_rules import tag_accuracies
from harness.api import ModelBundle, Prompt, SamplingParams
from harness.run import _build, guided
from harness.runtime.sampling import probs
from harness.runtime.seeding import image_seed

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


_JUDGE: Any = None


def score(images: np.ndarray, prompts: Sequence[Prompt]) -> dict[str, float]:
    """images [N, H, W, 3] uint8 -> per-tag accuracy and the overall mean of tags, judged by the
    geneval_shapes evaluator (conf/evaluator/geneval_shapes.yaml)."""
    global _JUDGE
    if _JUDGE is None:
        _JUDGE = _build(compose_config([]).evaluator.geneval_shapes, drop=())
    verdicts = _JUDGE.judge_images(list(images), [p.meta for p in prompts])
    return tag_accuracies([p.meta["tag"] for p in prompts], [v.correct for v in verdicts])


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
    target, harness.runtime.sampling.probs at temperature 1): tokens [N, L] -> p [N, L, V], where p[:, i]
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
    ctx = Context(models=bundle, cond=None, sampling=SamplingParams(cfg_scale=cfg), streams=None,
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
