"""Untimed quality sweep: shapes-GenEval of raster and of decoder variants on many prompts, each
with its paired gap to raster (evaluators/geneval_rules.paired_difference). Decodes at a large
batch (a GPU pays off here) and scores images in a process pool; no timing (benchmarks/mulo.py
times decoders at batch 1).

    python benchmarks/mulo_quality.py [--model shapes_x2] [--prompts 1536] [--seed 2]
                                      [--batch 256] [--device auto] [--procs 8] [--out DIR]
                                      [--variant NAME=DECODER[:OVERRIDE,...] ...]
                                      [--set KEY=VALUE ...] [--start N] [--raster-from CSV]

A variant names a decoder of the harness config (raster, zipar, mulo_sd, ...) and Hydra
overrides of that decoder's keys, e.g. `tau0=mulo_sd:accept.tau=0.0,draft.window=8`. Raster
always runs first. With --out, each row's per-image verdicts (sample_id, tag, correct, reason) go
to DIR/NAME.csv, so gaps between any two rows can be recomputed later. `--raster-from CSV` takes
the raster row from such a file instead of decoding it again (raster is the slowest row: 1024
target forwards per image on the x2 world); the file must hold exactly this run's samples (same
--prompts, --start and --seed), and it is the caller's word that it was drawn with this run's
target and sampling (a --set that changes either calls for a fresh raster row).

Besides GenEval, each row prints the share of images failing each kind of GenEval clause (an image
can fail several): `missing` (an object the prompt asks for is not found: fewer than its count),
`extra` (more objects than a counting prompt allows), `color` (objects found, not of the asked
colour) and `position` (objects found, not in the asked relation). They tell a decoder that loses
objects from one that draws them wrong. Images are drawn at the
benchmark's held-out seed by default (benchmarks/mulo.py: tune at seed 0 or 1, quote seed 2),
with per-image seeds, so a row does not depend on --batch (up to float rounding).
"""
from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.decoders import decode_all  # noqa: E402
from benchmarks.mulo import HELD_OUT_SEED, compose_config  # noqa: E402
from evaluators.geneval import GenEvalEvaluator  # noqa: E402
from evaluators.geneval_rules import paired_difference, tag_accuracies  # noqa: E402
from harness.datasets.prompts import shapes  # noqa: E402
from harness.run import _build, _device, guided  # noqa: E402
from harness.samples import SampleSpec, plan  # noqa: E402

log = logging.getLogger("benchmarks.mulo_quality")

# The x2 world's rows quoted in the README (MuLo-SD drafts with ZipAR window 8 on the 16-wide drafter).
X2_VARIANTS = (
    "zipar=zipar", "zipar16=zipar:window=16",
    "mulo_sd=mulo_sd:draft.window=8",
    "tau0=mulo_sd:draft.window=8,accept.tau=0.0",
    "tau0_serial_draft=mulo_sd:draft.schedule=serial,accept.tau=0.0",
    "local0=mulo_sd:draft.window=8,scope.radius=0",
    "local0_serial=mulo_sd:draft.window=8,scope.radius=0,resampler.schedule=serial",
    "local1=mulo_sd:draft.window=8,scope.radius=1",
    "k1tau1_w4=mulo_sd:draft.window=8,accept.k=1,accept.tau=1.0,resampler.window=4",
    "k1tau1_w8=mulo_sd:draft.window=8,accept.k=1,accept.tau=1.0,resampler.window=8",
)
CHUNK = 32  # images per scoring task
# GenEval's failed-clause reasons (evaluators/geneval_rules.py) by kind; the patterns exclude each other
FAILURES = (("missing", re.compile(r"^expected .+>=\d+, found \d+$")),
            ("extra", re.compile(r"^expected .+<\d+, found \d+$")),
            ("color", re.compile(r"^expected .+>=\d+, found \d+ \w+; and ")),
            ("position", re.compile(r"^(no target for .+ to be |expected .+ (left of|right of|above|below) target, found )")))


def parse_variant(text: str) -> tuple[str, str, list[str]]:
    """'NAME=DECODER[:k=v,k=v]' -> (NAME, DECODER, ['decoder.DECODER.k=v', ...])."""
    name, sep, rest = text.partition("=")
    decoder, _, overrides = rest.partition(":")
    if not sep or not name or not decoder or name == "raster":
        raise ValueError(f"--variant {text!r}: expected NAME=DECODER[:KEY=VALUE,...] with NAME other than raster")
    keys = [o for o in overrides.split(",") if o]
    if any("=" not in k for k in keys):
        raise ValueError(f"--variant {text!r}: every override needs KEY=VALUE")
    return name, decoder, [f"decoder.{decoder}.{k}" for k in keys]


def _use(evaluator: GenEvalEvaluator) -> None:
    global _EVALUATOR
    _EVALUATOR = evaluator


def score_chunk(job: tuple[np.ndarray, list[dict[str, Any]]]) -> list[tuple[bool, str]]:
    """images [n, H, W, 3] uint8 and their prompts' meta -> (correct, reason) per image, judged by
    the configured evaluator (`evaluator=geneval_shapes`)."""
    images, metas = job
    assert _EVALUATOR is not None, "score_chunk runs in a pool started with initializer=_use"
    return [(v.correct, v.reason) for v in _EVALUATOR.judge_images(list(images), metas)]


def failure_kind(line: str) -> str:
    """One failed-clause reason of GenEval -> its kind (FAILURES); unknown text is refused."""
    for kind, pattern in FAILURES:
        if pattern.search(line):
            return kind
    raise ValueError(f"GenEval reason {line!r} matches no failure kind {[k for k, _ in FAILURES]}")


def failure_shares(frame: pd.DataFrame) -> dict[str, float]:
    """Per-image verdicts with `reason` -> share of images failing each kind of clause."""
    kinds = [{failure_kind(line) for line in str(r).splitlines() if line} if isinstance(r, str) else set()
             for r in frame["reason"]]
    return {kind: sum(kind in k for k in kinds) / max(len(kinds), 1) for kind, _ in FAILURES}


@torch.inference_mode()
def images_of(models: Any, tokens: torch.Tensor, batch: int) -> np.ndarray:
    """tokens [n, N] -> images [n, H, W, 3] uint8, decoded `batch` at a time on the model's device."""
    device = models.target.device
    return np.concatenate([models.target.decode(tokens[i:i + batch].to(device)).permute(0, 2, 3, 1).cpu().numpy()
                           for i in range(0, len(tokens), batch)])


def verdicts(pool: Any, images: np.ndarray, specs: Sequence[SampleSpec]) -> pd.DataFrame:
    """Per-image verdicts (sample_id, tag, correct, reason), scored in `pool`."""
    metas = [s.prompt.meta for s in specs]
    jobs = [(images[i:i + CHUNK], metas[i:i + CHUNK]) for i in range(0, len(specs), CHUNK)]
    judged = [c for part in pool.map(score_chunk, jobs) for c in part]
    return pd.DataFrame({"sample_id": [s.sample_id for s in specs], "tag": [m["tag"] for m in metas],
                         "correct": [c for c, _ in judged], "reason": [r for _, r in judged]})


def overall(frame: pd.DataFrame) -> float:
    """GenEval overall: the unweighted mean of the per-tag accuracies."""
    return tag_accuracies(frame["tag"].tolist(), frame["correct"].tolist())["overall"]


def row_specs(start: int, prompts: int, seed: int) -> list[SampleSpec]:
    """The samples of a row: prompts [start, start + prompts) of `shapes`, one image each. Image
    seeds follow the prompt ids, so these are the images a run from 0 draws for those prompts."""
    return plan(shapes(start + prompts)[start:], images_per_prompt=1, global_seed=seed)


def stored_raster(path: Path, specs: Sequence[SampleSpec]) -> pd.DataFrame:
    """A raster row's per-image verdicts saved by an earlier --out, checked to hold exactly the
    samples `specs` (same prompts and image seeds: the sample ids encode both)."""
    if not path.is_file():
        raise FileNotFoundError(f"--raster-from {path}: no such file; pass the raster.csv an earlier "
                                "run wrote with --out")
    frame = pd.read_csv(path)
    missing = [c for c in ("sample_id", "tag", "correct", "reason") if c not in frame.columns]
    if missing:
        raise ValueError(f"--raster-from {path}: lacks columns {missing}; it must be a row CSV of --out")
    want, have = [s.sample_id for s in specs], frame["sample_id"].tolist()
    if sorted(want) != sorted(have):
        extra, lost = set(have) - set(want), set(want) - set(have)
        raise ValueError(f"--raster-from {path}: holds {len(have)} samples, this run draws {len(want)} "
                         f"({len(lost)} of them absent, {len(extra)} others present, e.g. "
                         f"{next(iter(lost or extra))!r}); use the --prompts, --start and --seed it was "
                         "written with")
    return frame.set_index("sample_id").loc[want].reset_index()


def run_row(pool: Any, model: str, decoder_name: str, overrides: list[str], seed: int, prompts: int,
            batch: int, device: torch.device, first: int = 0) -> tuple[pd.DataFrame, dict[str, float]]:
    """Decode every prompt with one decoder and score it: (verdicts, forwards and seconds).
    `overrides` are Hydra overrides of the harness config (the row's and the run's --set)."""
    cfg = compose_config(model, [*overrides, f"seed={seed}"])
    if decoder_name not in cfg.decoder:
        raise ValueError(f"no decoder {decoder_name!r}; the config has {sorted(cfg.decoder)}")
    bundle = _build(cfg.model, drop=("name", "sampling")).to(device)
    decoder = _build(cfg.decoder[decoder_name])
    models = guided(bundle, decoder.sampling)
    specs = row_specs(first, prompts, cfg.seed)
    start = time.perf_counter()
    _, tokens, stats = decode_all(decoder, models, specs, batch, device)
    decoded = time.perf_counter() - start
    frame = verdicts(pool, images_of(models, tokens, batch), specs)
    n = len(stats)
    return frame, {"target": sum(s.target_forwards for s in stats) / n,
                   "drafter": sum(s.drafter_forwards for s in stats) / n,
                   "decode_s": decoded, "score_s": time.perf_counter() - start - decoded}


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["random", "shapes", "shapes_x2"], default="shapes_x2")
    ap.add_argument("--prompts", type=int, default=1536)
    ap.add_argument("--start", type=int, default=0,
                    help="skip the first START prompts (their images are those a run from 0 draws, so "
                         "two runs' CSVs join into one larger sample)")
    ap.add_argument("--seed", type=int, default=HELD_OUT_SEED, help="global seed of the images")
    ap.add_argument("--batch", type=int, default=256, help="decode batch (one image seed per image)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--procs", type=int, default=2, help="processes scoring images")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--out", type=Path, default=None, help="folder for each row's per-image verdicts (CSV)")
    ap.add_argument("--variant", action="append", default=None, metavar="NAME=DECODER[:K=V,...]",
                    help="a row (repeatable; default: the x2 world's rows in the README)")
    ap.add_argument("--raster-from", type=Path, default=None, metavar="CSV",
                    help="take the raster row's verdicts from a raster.csv an earlier --out wrote for "
                         "the same prompts and seed, instead of decoding raster again")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a Hydra override of the harness config applied to every row, raster included "
                         "(repeatable), e.g. model.weights_dir=DIR to score other weights of the world")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    for noisy in ("evaluators", "harness.samples", "baselines.upsamplers"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    try:
        rows = [("raster", "raster", []), *(parse_variant(v) for v in (a.variant or X2_VARIANTS))]
    except ValueError as err:
        ap.error(str(err))
    if any("=" not in o for o in a.set):
        ap.error(f"--set needs KEY=VALUE, got {[o for o in a.set if '=' not in o]}")
    if a.procs < 1 or a.prompts < 1 or a.batch < 1 or a.start < 0:
        ap.error("--procs, --prompts and --batch must be >= 1 and --start >= 0")
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
    device = _device(a.device)
    print(f"model={a.model} start={a.start} prompts={a.prompts} seed={a.seed} batch={a.batch} device={device}"
          + "".join(f" {o}" for o in a.set), flush=True)
    print(f"{'row':<20}{'target':>8}{'drafter':>9}{'geneval':>9}{'gap':>8}{'gap_se':>8}{'decode_s':>10}"
          + "".join(f"{kind:>9}" for kind, _ in FAILURES), flush=True)
    evaluator = _build(compose_config(a.model, a.set).evaluator.geneval_shapes)
    # fork the scoring processes before the decoders touch a GPU
    with get_context("fork").Pool(a.procs, initializer=_use, initargs=(evaluator,)) as pool:
        raster: pd.DataFrame | None = None
        for name, decoder_name, overrides in rows:
            if name == "raster" and a.raster_from is not None:
                frame = stored_raster(a.raster_from, row_specs(a.start, a.prompts, a.seed))
                counts = {"target": float("nan"), "drafter": float("nan"), "decode_s": float("nan")}
            else:
                frame, counts = run_row(pool, a.model, decoder_name, [*a.set, *overrides], a.seed,
                                        a.prompts, a.batch, device, a.start)
            raster = frame if raster is None else raster
            gap, se = paired_difference(frame, raster)
            if a.out:
                frame.to_csv(a.out / f"{name}.csv", index=False)
            shares = failure_shares(frame)
            print(f"{name:<20}{counts['target']:>8.1f}{counts['drafter']:>9.1f}{overall(frame):>9.3f}"
                  f"{gap:>+8.3f}{se:>8.3f}{counts['decode_s']:>10.0f}"
                  + "".join(f"{shares[kind]:>9.3f}" for kind, _ in FAILURES), flush=True)


if __name__ == "__main__":
    main()
