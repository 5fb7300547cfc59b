"""What the benchmarks share: they compose a harness config (an experiment, decoder variants as
Hydra overrides), run the pipeline (harness.run.run: generate -> SampleSet -> evaluators ->
summary.csv, timed by harness/generate.py) and render its summary with the reporting package
(harness.report). No benchmark times or scores decoders itself: each number in a benchmark's
table is a row of that run's summary.csv, next to its run.json and SampleSets.
"""
from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python benchmarks/x.py` from a clone: decoders of benchmarks/ load
    sys.path.insert(0, str(ROOT))

from harness.report.build import build_table  # noqa: E402
from harness.report.paper_reference import load_paper_numbers  # noqa: E402
from harness.report.render import to_markdown  # noqa: E402
from harness.report.specs import (ACCEPTANCE, DRAFTER_FORWARDS, FID, SPEEDUP, STEP_COMPRESSION,  # noqa: E402
                                  TARGET_FORWARDS, MetricSpec, TableSpec)
from harness.run import run  # noqa: E402

CONF = ROOT / "conf"
# `model=random` sized like the shapes world (16x16 tokens, 512 codes, width 256, 4 layers)
RANDOM_LIKE_SHAPES = {"model.grid": "16", "model.vocab": "512", "model.dim": "256", "model.n_layer": "4"}
NOISE = MetricSpec("timing_noise", "Noise", "timing_noise", decimals=2, higher_is_better=False)
GENEVAL = MetricSpec("geneval", "GenEval", "geneval", decimals=3)
GAP = MetricSpec("gap", "Gap", "geneval_gap_vs_raster", decimals=3, error=True)
VERIFY = MetricSpec("verify_forwards", "Verify fwd", "verify_forwards", higher_is_better=False)
RESAMPLE = MetricSpec("resample_forwards", "Resample fwd", "resample_forwards", higher_is_better=False)
ISLANDS = MetricSpec("islands_per_step", "Isl/step", "islands_per_step", decimals=2, higher_is_better=False)
ISLAND_SIZE = MetricSpec("island_size", "Isl size", "island_size", higher_is_better=False)
LATENCY_MS = MetricSpec("latency_ms", "Latency (ms)", "latency_s", scale=1000.0, decimals=1, higher_is_better=False)
KID = MetricSpec("kid", "KID", "kid", decimals=4, higher_is_better=False, error=True)
# every metric a decoder table may show; columns no row has are dropped
METRICS = (TARGET_FORWARDS, DRAFTER_FORWARDS, VERIFY, RESAMPLE, STEP_COMPRESSION, LATENCY_MS, SPEEDUP, NOISE,
           ACCEPTANCE, ISLANDS, ISLAND_SIZE, GENEVAL, GAP, FID, KID)


def quiet() -> None:
    """INFO logging for the benchmark and the pipeline's progress, not the evaluators' chatter."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("evaluators", "harness.store.samples", "harness.store.provenance", "baselines.methods.upsamplers"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    logging.getLogger("harness.run").setLevel(logging.WARNING)  # its warnings (timing noise), not its table


def compose_config(overrides: Sequence[str], model: str | None = None) -> DictConfig:
    """conf/config.yaml composed with `overrides` (and `model=`); a random model is sized like the
    shapes world unless the overrides size it."""
    keys = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    sized = [f"{k}={v}" for k, v in RANDOM_LIKE_SHAPES.items() if model == "random" and k not in keys]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=[*([f"model={model}"] if model else []), *sized,
                                                        *overrides])


def variant(name: str, base: str, extra: Sequence[str]) -> list[str]:
    """Overrides that add decoder `name`: the config of decoder `base` with `extra` (KEY=VALUE,
    relative to the decoder), e.g. variant("mulo_k1", "mulo_sd", ["accept.k=1"])."""
    return [f"+decoder@decoder.{name}={base}", *(f"decoder.{name}.{e}" for e in extra)]


def mirrored(overrides: Sequence[str], names: Sequence[str], base: str = "mulo_sd") -> list[str]:
    """`overrides` with every `decoder.<base>.KEY=V` repeated for each decoder in `names` (variants
    of `base`) that does not set KEY itself (e.g. the x2 world's `decoder.mulo_sd.draft.window=8`
    reaches every MuLo-SD row)."""
    own = {o.split("=", 1)[0] for o in overrides}
    out = list(overrides)
    for name in names:
        for o in overrides:
            if o.startswith(f"decoder.{base}."):
                copy = o.replace(f"decoder.{base}.", f"decoder.{name}.", 1)
                if copy.split("=", 1)[0] not in own:
                    out.append(copy)
    return out


def run_job(cfg: DictConfig, out: Path) -> pd.DataFrame:
    """Run the pipeline into `out`; its summary with the `run_dir` column the report reads."""
    summary = run(cfg, out)
    logging.getLogger("benchmarks").info("%s: %d summary rows -> %s", cfg.name, len(summary), out)
    return summary.assign(run_dir=str(out))


def decoder_table(summary: pd.DataFrame, title: str, labels: dict[str, str] | Sequence[tuple[str, str]] = (),
                  metrics: Sequence[MetricSpec] = METRICS) -> str:
    """A Markdown table of `summary`: one row per decoder (labels: decoder -> row label, in order),
    the metrics any row has (speed-ups with their confidence interval, gaps +- standard error)."""
    experiments = tuple(dict.fromkeys(summary["experiment"].astype(str)))
    spec = TableSpec(name=experiments[0], title=title, experiments=experiments, metrics=tuple(metrics),
                     methods=tuple(dict(labels).items()), drop_empty_metrics=True)
    return to_markdown(build_table(summary, spec, load_paper_numbers(), paper_rows=False))


def value(summary: pd.DataFrame, decoder: str, metric: str, column: str = "value") -> float:
    """One number of a summary (subset "all"); NaN when absent."""
    rows = summary[(summary.decoder == decoder) & (summary.metric == metric) & (summary.subset == "all")]
    return float(rows[column].iloc[0]) if len(rows) and column in rows else float("nan")


def out_dir(out: Path | None, benchmark: str) -> Path:
    """Where a benchmark writes its runs: `out`, or results/benchmarks/<benchmark>/<time>."""
    return out or ROOT / "results" / "benchmarks" / benchmark / time.strftime("%Y-%m-%d_%H-%M-%S")


def header(**fields: Any) -> str:
    """The first line a benchmark prints: its settings as key=value."""
    return " ".join(f"{k}={v}" for k, v in fields.items())
