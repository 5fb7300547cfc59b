"""Decoders side by side: raster, SJD, draft-model SD, LANTERN and ZipAR (+experiment=baselines) on
one model, one pipeline run per batch size (harness.run.run: interleaved, repeated timing; speed
and shapes-GenEval evaluators) under <--out>/batch_<B>/, rendered with harness.report.

    python benchmarks/decoders.py [--model random|shapes] [--images 16] [--reps 3] [--batches 1 8]
                                  [--decoders raster sjd ...] [--device auto] [--threads N] [--out DIR]
                                  [hydra overrides ...]

Per (batch, decoder): target and drafter forwards per image, step compression (tokens per target
forward), median latency of a batch, speed-up versus raster with its 95% interval, timing_noise,
`lag` = step compression / speed-up (how far wall-clock falls short of the forward-count saving)
and GenEval (shapes detector). Images do not depend on the batch size (per-image seeds): the script
compares the runs' PNGs and warns when they differ. `--model random` is sized like the shapes world
(16x16 tokens, 512 codes, width 256, 4 layers) unless overridden: its acceptance and quality numbers
mean nothing, its speeds are real.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Sequence

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import (DRAFTER_FORWARDS, GENEVAL, LATENCY_MS, NOISE, SPEEDUP, STEP_COMPRESSION,  # noqa: E402
                               TARGET_FORWARDS, compose_config, decoder_table, header, out_dir, quiet, run_job,
                               value)
from harness.report.specs import METHOD_LABELS, MetricSpec  # noqa: E402

log = logging.getLogger("benchmarks.decoders")
DECODERS = ("raster", "sjd", "sd", "lantern_chain", "eagle2", "lantern", "zipar", "zipar_w4")
LAG = MetricSpec("lag", "Lag", "lag", decimals=2, higher_is_better=False)


def with_lag(summary: pd.DataFrame) -> pd.DataFrame:
    """The run's summary plus a `lag` row per decoder: step_compression / speedup_vs_raster."""
    speed = summary[(summary.metric == "speedup_vs_raster") & (summary.subset == "all")]
    nan = float("nan")
    rows = [{**row.to_dict(), "metric": "lag", "value": value(summary, row.decoder, "step_compression") / row.value,
             "stderr": nan, "ci_low": nan, "ci_high": nan, "higher_is_better": False} for _, row in speed.iterrows()]
    return pd.concat([summary, pd.DataFrame(rows)], ignore_index=True)


def same_images(a: Path, b: Path) -> list[str]:
    """Decoders whose PNGs differ between two runs' SampleSets."""
    return sorted(d.name for d in a.iterdir() if d.is_dir() and any(
        p.read_bytes() != (b / d.name / "images" / p.name).read_bytes() for p in (d / "images").glob("*.png")))


def main(argv: Sequence[str] | None = None) -> dict[int, pd.DataFrame]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["random", "shapes"], default="random")
    ap.add_argument("--images", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3, help="timed decodes of each batch (timing.reps)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--decoders", nargs="+", default=list(DECODERS))
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--out", type=Path, default=None,
                    help="folder of the runs (default: results/benchmarks/decoders/<time>)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. sampling.cfg_scale=3")
    a = ap.parse_args(argv)
    quiet()
    if "raster" not in a.decoders:
        ap.error("--decoders must include raster (the speed-up reference)")
    out = out_dir(a.out, "decoders")
    print(header(model=a.model, images=a.images, reps=a.reps, batches=a.batches, device=a.device, out=out),
          flush=True)
    summaries = {}
    for batch in a.batches:
        cfg = compose_config(["+experiment=baselines", f"decoder=[{','.join(a.decoders)}]", f"batch_size={batch}",
                              f"dataset.n={max(a.images, 64)}", f"dataset_limit={a.images}", f"timing.reps={a.reps}",
                              "timing.images=null", "timing.batch_size=null",
                              f"device={a.device}", "evaluator.geneval_shapes.show_progress=false",
                              *([f"threads={a.threads}"] if a.threads else []), *a.overrides], a.model)
        summaries[batch] = with_lag(run_job(cfg, out / f"batch_{batch}"))
        print(decoder_table(summaries[batch], f"decoders at batch {batch} ({cfg.model.name})", METHOD_LABELS,
                            (TARGET_FORWARDS, DRAFTER_FORWARDS, STEP_COMPRESSION, LATENCY_MS, SPEEDUP, NOISE, LAG,
                             GENEVAL)), flush=True)
    first = out / f"batch_{a.batches[0]}" / "samples"
    for batch in a.batches[1:]:
        differ = same_images(first, out / f"batch_{batch}" / "samples")
        if differ:
            log.warning("images differ between batch %d and %d for %s (per-image seeds are broken, or float "
                        "rounding of batched kernels)", a.batches[0], batch, ", ".join(differ))
    return summaries


if __name__ == "__main__":
    main()
