"""Harness overhead: raster decoding through the harness versus a bare loop of model forwards on
the same model, measured side by side (interleaved repetitions) in one run.

    python benchmarks/overhead.py [--model random|shapes] [--batch 1] [--images 8] [--reps 3]

Prints images/s for: the bare loop (prefill + one cached forward per token + sampling), the
RasterDecoder alone, and the whole generate() stage (conditioning, decoding, VQ decode, PNG
writes into a SampleSet), with their ratios to the bare loop.
"""
from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path

import torch

from baselines.raster import RasterDecoder
from harness.api import ModelBundle, SamplingParams
from harness.datasets.prompts import shapes
from harness.generate import generate
from harness.run import guided
from harness.samples import SampleSet, plan
from harness.sampling import sample
from harness.seeding import make_generators


def load_bundle(name: str) -> ModelBundle:
    if name == "shapes":
        from harness.shapes.bundle import load

        return load()
    from harness.models.random_init import build

    return build(grid=16, vocab=512, dim=256, n_layer=4, n_head=4, prefix_len=10)


@torch.inference_mode()
def bare_loop(models: ModelBundle, prompts: list[str], params: SamplingParams) -> None:
    """The minimum any raster decoder must do: one cached forward per token plus sampling."""
    model = models.target
    n = model.grid[0] * model.grid[1]
    gens = make_generators(list(range(len(prompts))), "cpu")
    model.setup_cache(len(prompts))
    logits = model.prefill(models.condition(prompts))
    for i in range(n):
        tok = sample(logits, params, gens)
        if i + 1 < n:
            logits = model.forward(tok[:, None], torch.tensor([i]))[:, 0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["random", "shapes"], default="random")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cfg", type=float, default=1.0)
    a = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    params = SamplingParams(temperature=1.0, cfg_scale=a.cfg)
    models = guided(load_bundle(a.model), params)
    prompts = shapes(a.images)
    texts = [p.text for p in prompts]
    decoder = RasterDecoder(params)
    times: dict[str, list[float]] = {"bare loop": [], "RasterDecoder": [], "generate() stage": []}
    bare_loop(models, texts[: a.batch], params)  # warm-up
    for rep in range(a.reps):
        t = time.perf_counter()
        for i in range(0, a.images, a.batch):
            bare_loop(models, texts[i : i + a.batch], params)
        times["bare loop"].append(time.perf_counter() - t)
        t = time.perf_counter()
        for i in range(0, a.images, a.batch):
            chunk = prompts[i : i + a.batch]
            decoder.generate(models, models.condition([p.text for p in chunk]), list(range(len(chunk))))
        times["RasterDecoder"].append(time.perf_counter() - t)
        with tempfile.TemporaryDirectory() as tmp:
            specs = plan(prompts, 1, rep)
            t = time.perf_counter()
            generate(decoder, models, SampleSet(Path(tmp)), specs, batch_size=a.batch, warmup_batches=0,
                     device=torch.device("cpu"), name="raster")
            times["generate() stage"].append(time.perf_counter() - t)
    base = statistics.median(times["bare loop"])
    print(f"model={a.model} batch={a.batch} images={a.images} reps={a.reps} threads={torch.get_num_threads()}")
    print(f"{'path':<18} {'img/s':>8} {'time/bare':>10}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<18} {a.images / med:8.2f} {med / base:10.3f}")


if __name__ == "__main__":
    main()
