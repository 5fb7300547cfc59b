"""Decoders side by side in one run: raster, SJD, draft-model SD, LANTERN and ZipAR (the configs in
conf/decoder/) on one model, at batch 1 and batch 8, with repetitions interleaved across decoders
so that machine load affects them alike.

    python benchmarks/decoders.py [--model random|shapes] [--images 16] [--reps 3] [--batches 1 8]
                                  [--decoders raster sjd ...] [--device auto] [hydra overrides ...]

Per (batch, decoder): target and drafter forwards per image, step compression (tokens per target
forward), wall-clock speed-up versus raster (median over repetitions of the decode time of all
images), `lag` = step compression / speed-up (how far wall-clock falls short of the forward-count
saving), and GenEval (shapes detector) on the images. Images do not depend on the batch size
(per-image seeds); the script checks that. `--model random` is sized like the shapes world
(16x16 tokens, 512 codes, width 256, 4 layers) unless overridden; its acceptance and quality
numbers mean nothing, its speeds are real.
"""
from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd
import torch
from hydra import compose, initialize_config_dir

from harness.api import DecodeStats, ModelBundle, SamplingParams
from harness.datasets.prompts import shapes
from harness.run import _build, _device, guided
from harness.samples import SampleSet, SampleSpec, plan

log = logging.getLogger("benchmarks.decoders")

CONF = Path(__file__).resolve().parents[1] / "conf"
DECODERS = ("raster", "sjd", "sd", "lantern", "zipar", "zipar_w4")
RANDOM_LIKE_SHAPES = {"model.grid": "16", "model.vocab": "512", "model.dim": "256", "model.n_layer": "4"}


def compose_config(model: str, decoders: Sequence[str], overrides: Sequence[str]) -> Any:
    """The harness config with these decoders and the GenEval (shapes) evaluator."""
    keys = {o.split("=", 1)[0].lstrip("+") for o in overrides}
    defaults = [f"{k}={v}" for k, v in RANDOM_LIKE_SHAPES.items() if model == "random" and k not in keys]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=[
            f"model={model}", f"decoder=[{','.join(decoders)}]", "evaluator=[geneval_shapes]",
            "evaluator.geneval_shapes.show_progress=false", *defaults, *overrides])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decode_all(decoder: Any, models: ModelBundle, specs: Sequence[SampleSpec], batch: int,
               device: torch.device, before: Callable[[int, int], None] | None = None
               ) -> tuple[float, torch.Tensor, list[DecodeStats]]:
    """Decode every spec in batches; return (seconds spent in generate, tokens [n, N], stats).
    `before(start, stop)`, if given, runs untimed ahead of the batch of specs[start:stop]."""
    spent, tokens, stats = 0.0, [], []
    for i in range(0, len(specs), batch):
        chunk = specs[i : i + batch]
        if before is not None:
            before(i, i + len(chunk))
        cond = models.condition([s.prompt.text for s in chunk])
        _sync(device)
        start = time.perf_counter()
        gen = decoder.generate(models, cond, [s.seed for s in chunk])
        _sync(device)
        spent += time.perf_counter() - start
        tokens.append(gen.tokens.cpu())
        stats.extend(gen.stats)
    return spent, torch.cat(tokens), stats


def geneval_verdicts(evaluator: Any, models: ModelBundle, specs: Sequence[SampleSpec], tokens: torch.Tensor,
                     stats: Sequence[DecodeStats], folder: Path) -> tuple[float, pd.DataFrame | None]:
    """Write the images into a SampleSet and score them with GenEval: (overall accuracy, the
    per-image verdicts with sample_id / tag / correct, for paired comparisons)."""
    sample_set = SampleSet(folder)
    sample_set.ensure_writable()
    images = models.target.decode(tokens.to(models.target.device)).permute(0, 2, 3, 1).cpu().numpy()
    for spec, image, st in zip(specs, images, stats):
        sample_set.write(spec, image, {"batch_id": "0", "batch_latency_s": 0.0, **st.as_row()})
    result = evaluator.evaluate(sample_set)
    row = result.summary[(result.summary.metric == "geneval") & (result.summary.subset == "all")]
    return (float(row.value.iloc[0]) if len(row) else float("nan")), result.per_sample


def geneval_score(evaluator: Any, models: ModelBundle, specs: Sequence[SampleSpec], tokens: torch.Tensor,
                  stats: Sequence[DecodeStats], folder: Path) -> float:
    """GenEval overall accuracy of the images (geneval_verdicts without the verdicts)."""
    return geneval_verdicts(evaluator, models, specs, tokens, stats, folder)[0]


def per_image(stats: Sequence[DecodeStats]) -> dict[str, float]:
    n = len(stats)
    target = sum(s.target_forwards for s in stats)
    return {"target_fwd": target / n, "drafter_fwd": sum(s.drafter_forwards for s in stats) / n,
            "step_compression": sum(s.tokens for s in stats) / target}


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["random", "shapes"], default="random")
    ap.add_argument("--images", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--decoders", nargs="+", default=list(DECODERS))
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. sampling.cfg_scale=3")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    for noisy in ("evaluators", "harness.samples"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if a.threads:
        torch.set_num_threads(a.threads)
    if "raster" not in a.decoders:
        ap.error("--decoders must include raster (the speed-up reference)")
    cfg = compose_config(a.model, a.decoders, a.overrides)
    device = _device(a.device)
    bundle = _build(cfg.model, drop=("name", "sampling")).to(device)
    decoders = {name: _build(cfg.decoder[name]) for name in a.decoders}
    sampling: SamplingParams = decoders["raster"].sampling
    models = guided(bundle, sampling)
    specs = plan(shapes(a.images), images_per_prompt=1, global_seed=cfg.seed)
    evaluator = _build(cfg.evaluator.geneval_shapes)

    rows, reference = [], {}
    for batch in a.batches:
        times: dict[str, list[float]] = {name: [] for name in decoders}
        outputs: dict[str, tuple[torch.Tensor, list[DecodeStats]]] = {}
        for name, dec in decoders.items():  # warm-up: one batch each, untimed
            decode_all(dec, models, specs[:batch], batch, device)
        for rep in range(a.reps):
            order = list(decoders)[rep % len(decoders):] + list(decoders)[: rep % len(decoders)]
            for name in order:
                spent, tokens, stats = decode_all(decoders[name], models, specs, batch, device)
                times[name].append(spent)
                outputs.setdefault(name, (tokens, stats))
            log.info("batch %d: repetition %d of %d done", batch, rep + 1, a.reps)
        base = statistics.median(times["raster"])
        for name in decoders:
            tokens, stats = outputs[name]
            same = reference.setdefault(name, tokens)
            if not torch.equal(same, tokens):
                log.warning("%s: images differ between batch sizes (per-image seeds are broken)", name)
            speed = base / statistics.median(times[name])
            counts = per_image(stats)
            rows.append({"batch": batch, "decoder": name, **counts, "speedup": speed,
                         "s_per_img": statistics.median(times[name]) / len(specs),
                         "lag": counts["step_compression"] / speed})
    with tempfile.TemporaryDirectory() as tmp:
        quality = {name: geneval_score(evaluator, models, specs, reference[name], outputs[name][1],
                                       Path(tmp) / name) for name in decoders}
    print(f"model={a.model} images={a.images} reps={a.reps} device={device} "
          f"threads={torch.get_num_threads()} sampling={sampling}")
    header = f"{'batch':>5} {'decoder':<10} {'target/img':>10} {'drafter/img':>11} {'step_comp':>9} " \
             f"{'s/img':>8} {'speedup':>8} {'lag':>6} {'geneval':>8}"
    print(header)
    for r in rows:
        print(f"{r['batch']:>5} {r['decoder']:<10} {r['target_fwd']:>10.1f} {r['drafter_fwd']:>11.1f} "
              f"{r['step_compression']:>9.2f} {r['s_per_img']:>8.4f} {r['speedup']:>8.2f} {r['lag']:>6.2f} "
              f"{quality[r['decoder']]:>8.3f}")


if __name__ == "__main__":
    main()
