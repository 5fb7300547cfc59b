"""Quality report of the shipped shapes world, per GenEval tag:

1. detector accuracy (share of images whose own caption passes GenEval's rules) on ground-truth
   renders and on tokenizer reconstructions, at the target's size (64 px; x2 world 128 px) and the
   drafter's (32 px; x2 world 64 px);
2. shapes-GenEval of raster samples from the target (with and without CFG) and from the drafter:
   pipeline runs (harness.run.run, decoder=raster, untimed; the drafter as the target of a bundle,
   `drafter_bundle`) under --out, their per-tag rows read from summary.csv;
3. drafter-target agreement: the drafter's samples up-sampled to the target grid (decode ->
   nearest resize -> encode), teacher-forced through the target: mean target probability of the
   up-sampled draft tokens and the share where the draft token is the target's argmax;
4. per MuLo-SD up-sampler (baselines/methods/upsamplers.py: pixel bicubic / nearest, token replication,
   the learned ones shipped for the target's grid): shapes-GenEval of the drafter's samples
   up-sampled (what tau = 0 keeps), and the share of their tokens that the pooled-threshold rule
   would reject, teacher-forced through the CFG-guided target, at k in POOL_K and tau in POOL_TAU
   (baselines/methods/pooled.py). The drafter's samples are drawn serially (raster order).
Every image is judged by the geneval_shapes evaluator of conf/evaluator/ (items 1, 3 and 4 through
its `judge_images`); nothing is timed.

    python benchmarks/shapes_world.py [--world x1|x2] [--prompts 96] [--cfg 3.0] [--threads 2] [--out DIR]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import compose_config, out_dir, quiet, run_job  # noqa: E402
from benchmarks.shapes_drafts import POOL_K, POOL_TAU, agreement, raster_tokens, score, upsampler_rows  # noqa: E402
from harness.api import ModelBundle, Prompt  # noqa: E402
from harness.datasets.prompts import shapes  # noqa: E402
from harness.shapes.bundle import load  # noqa: E402
from harness.shapes.scenes import render, scene_for_caption  # noqa: E402
from harness.shapes.weights import WORLDS  # noqa: E402

TAGS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")


def drafter_bundle(weights_dir: str | None = None, world: str = "x1", **_: Any) -> ModelBundle:
    """The world's drafter as the target of a bundle (model._target_ of the drafter's raster run)."""
    bundle = load(weights_dir, small_drafter=False, world=world)
    return ModelBundle(name=f"{bundle.name}_drafter", target=bundle.drafter,  # type: ignore[arg-type]
                       conditioner=bundle.conditioner, weights_id=f"{bundle.weights_id}:drafter")


def raster_rows(world: str, weights: str | None, prompts: int, cfg: float,
                out: Path) -> dict[str, dict[str, float]]:
    """Per-tag shapes-GenEval of raster samples (target at cfg 1 and `cfg`, drafter at `cfg`): one
    untimed pipeline run each, under `out`."""
    model = "shapes" if world == "x1" else f"shapes_{world}"
    common = ["decoder=[raster]", "evaluator=[geneval_shapes]", "evaluator.geneval_shapes.show_progress=false",
              f"dataset.n={prompts}", "timing.images=0", "batch_size=64", "seed=0", "name=shapes_world",
              *([f"model.weights_dir={weights}"] if weights else [])]
    runs = {f"target raster cfg={c}": (f"target_cfg{c}", [f"sampling.cfg_scale={c}"]) for c in (1.0, cfg)}
    runs[f"drafter raster cfg={cfg}"] = ("drafter", [f"sampling.cfg_scale={cfg}", f"model.name={model}_drafter",
                                                     "model._target_=benchmarks.shapes_world.drafter_bundle"])
    rows = {}
    for label, (folder, extra) in runs.items():
        summary = run_job(compose_config([*common, *extra], model), out / folder)
        geneval = summary[summary.metric == "geneval"]
        rows[label] = {("overall" if s == "all" else s): float(v) for s, v in zip(geneval.subset, geneval.value)}
    return rows


def ground_truth(prompts: Sequence[Prompt], size: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.stack([render(scene_for_caption(p.meta, rng), size) for p in prompts])


@torch.inference_mode()
def reconstruct(bundle: ModelBundle, images: np.ndarray) -> np.ndarray:
    tok = bundle.target.tokenizer  # type: ignore[attr-defined]
    x = torch.from_numpy(images).permute(0, 3, 1, 2)
    return tok.decode(tok.encode(x)).permute(0, 2, 3, 1).numpy()


def row(name: str, scores: dict[str, float]) -> str:
    return f"{name:<34}" + " ".join(f"{scores.get(t, float('nan')):>8.3f}" for t in (*TAGS, "overall"))


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=96)
    ap.add_argument("--cfg", type=float, default=3.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--weights", default=None, help="weights folder (default: the shipped weights)")
    ap.add_argument("--world", default="x1", choices=sorted(WORLDS), help="x2: the 32x32 world (model=shapes_x2)")
    ap.add_argument("--out", type=Path, default=None, help="folder of the raster runs")
    a = ap.parse_args(argv)
    quiet()
    torch.set_num_threads(a.threads)
    prompts, bundle = shapes(a.prompts), load(a.weights, small_drafter=False, world=a.world)
    big, small = bundle.target.grid[0] * 4, bundle.drafter.grid[0] * 4
    pipeline = raster_rows(a.world, a.weights, a.prompts, a.cfg, out_dir(a.out, "shapes_world"))
    print(f"{a.prompts} prompts ({a.prompts // 6} per tag)")
    print(f"{'':<34}" + " ".join(f"{t[:8]:>8}" for t in (*TAGS, "overall")))
    for size in (big, small):
        gt = ground_truth(prompts, size)
        print(row(f"detector on ground truth {size}px", score(gt, prompts)))
        print(row(f"detector on reconstructions {size}px", score(reconstruct(bundle, gt), prompts)))
    for label, scores in pipeline.items():
        print(row(label if "drafter" not in label else f"{label} ({small}px)", scores))
    low = raster_tokens(bundle, prompts, a.cfg, drafter=True)
    draft = bundle.drafter.decode(low).permute(0, 2, 3, 1).numpy()
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
