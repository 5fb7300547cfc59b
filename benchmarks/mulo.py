"""MuLo-SD against raster, SJD, LANTERN and ZipAR in one run at batch 1 (issue 5), then the paper's
ablations (paper.md §10.2) on the same prompts.

    python benchmarks/mulo.py [--model shapes|shapes_x2|random] [--images 16] [--reps 2] [--fid]
                              [--quality-images 96] [--quality-batch 8]
                              [--ablations [--only ablation_upsampling ...]] [--diagnose]
                              [--frontier [--frontier-taus TAU ...]] [--seed 2]
                              [--no-main] [--device auto]
                              [--threads 1] [hydra overrides ...]

Main table (raster, SJD, LANTERN, ZipAR, MuLo-SD in the paper's configuration and
`mulo_sd_anchored`, MuLo-SD whose redraws stay in the draft token's codebook neighbourhood), per
decoder: target / drafter forwards per image, the target's split into verify and
resample forwards, step compression (tokens per target forward), wall-clock speed-up versus raster
(median of `reps` interleaved repetitions), GenEval (shapes detector) and, with --fid, FID against
ground-truth renders. Ablation tables: (a) up-samplers, (b) pooling k x tau, (c) raster vs local
l = 0..4, (d) serial/parallel drafting x resampling and the resampler window, and the two open
questions; each row with speed-up, step compression, acceptance and GenEval. Decoder variants are
composed from the experiment configs (conf/experiment/ablation_*.yaml), so the benchmark measures
what they run.

--diagnose adds a table that splits MuLo-SD's quality loss (untimed, on the quality images):
the same decoder with its real drafter; with an oracle drafter that replays D_r(the target's own
raster sample) (harness/models/replay.py: the draft's layout is the target's); with k = 1,
tau = 1 (drafts are kept only where the target is certain, so nearly everything is resampled:
the resampler alone); each with the paper's parallel resampler and with serial resampling; and
the real drafter and the resampler alone with a resampler window of 4 (how the cost of parallel
resampling and of the kept drafts moves with the window).

--no-main skips the main table, for a run of only the ablations, the frontier or the diagnosis
(each of which has its own raster row).

--frontier times MuLo-SD at several operating points beside raster (resampler window 2, 3, 4,
8, each with the configured acceptance rule and with k = 1, tau = 1, which resamples nearly every
position after t0; with --frontier-taus T1 T2 ..., the configured decoder at each acceptance
threshold instead) and prints the issue's goal as a verdict: which rows give >= 4x fewer target
forwards, >= 3x wall-clock and a GenEval gap of at least -0.02; the fastest row within the gap;
the best gap among rows at >= 3x; and the rows on the speed-up / gap Pareto front.

Timing needs few images, a 2-point GenEval difference needs many: with `--quality-images N`,
GenEval and FID are scored on N images (the first `--images` of them are the timed ones) decoded
untimed at batch `--quality-batch`; forwards and acceptance stay those of the timed batch-1 run.
Every table gives each row's GenEval gap to raster on the same images (`gap`) with its paired
standard error (`gap_se`; evaluators/geneval_rules.paired_difference), which says how far a
gap such as the 2-point goal can be read from the number of quality images used. The standard
error does not cover selection: a setting chosen by its score on some images must be scored on
others. The shipped shapes weights and MuLo-SD's defaults were chosen on the first 384 prompts at
seed 0, where MuLo-SD's gap reads -0.115; on 1536 prompts it is -0.210 at seed 0 and -0.255 at
seed 2 (README).

Seeds: the benchmark draws its images at `--seed` (default HELD_OUT_SEED = 2), a global seed on
which no shipped weight or default was chosen. Seed 0 (the harness's default, holding the first
384 prompts) chose the shipped target stage and MuLo-SD's settings; seed 1 checked those choices
(README). Tune at seed 0 or 1 and quote seed 2 with `--quality-images 1536`: once a setting is
chosen by its score at seed 2, that seed no longer measures it.
"""
from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

import torch
from hydra import compose, initialize_config_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.decoders import RANDOM_LIKE_SHAPES, decode_all, geneval_verdicts  # noqa: E402
from baselines.canvas import Context  # noqa: E402
from evaluators.geneval_rules import paired_difference  # noqa: E402
from harness.api import DecodeStats, ModelBundle  # noqa: E402
from harness.datasets.prompts import shapes  # noqa: E402
from harness.models.replay import ReplayModel  # noqa: E402
from harness.run import _build, _device, guided  # noqa: E402
from harness.samples import SampleSet, SampleSpec, plan  # noqa: E402

log = logging.getLogger("benchmarks.mulo")

CONF = Path(__file__).resolve().parents[1] / "conf"
MAIN = ("raster", "sjd", "lantern", "zipar", "mulo_sd", "mulo_sd_anchored")
MULO_ROWS = ("mulo_sd", "mulo_sd_anchored")  # the rows the main table's goal verdict reads
ABLATIONS = {  # experiment -> decoders to take from it (raster is always measured)
    "ablation_upsampling": None, "ablation_local": None, "ablation_parallel": None,
    "ablation_open_questions": None,
}
POOLING = {"k": (1, 4, 16, 64), "tau": (0.05, 0.1, 0.3)}
FRONTIER = {"windows": (2, 3, 4, 8), "rules": {"": [], " k=1 tau=1": ["accept.k=1", "accept.tau=1.0"]}}
GOAL = {"forwards": 4.0, "speedup": 3.0, "gap": -0.02}  # issue 5: vs raster, shapes-GenEval gap
HELD_OUT_SEED = 2  # global seed of the benchmark's images: never used to choose weights or defaults
GOAL_IMAGES = 1536  # quality images below which a verdict's gap cannot resolve the goal's 2 points


def sample_note(images: int) -> str | None:
    """A warning to print under a verdict read off fewer than GOAL_IMAGES quality images."""
    if images >= GOAL_IMAGES:
        return None
    return (f"note: GenEval on {images} images cannot resolve the goal's 2-point gap (paired standard error "
            f"about 0.012 at {GOAL_IMAGES}); score with --quality-images {GOAL_IMAGES} or "
            "benchmarks/mulo_quality.py")


def mirrored(overrides: Sequence[str]) -> list[str]:
    """Overrides with each `decoder.mulo_sd.KEY=V` repeated for `decoder.mulo_sd_anchored` (MuLo-SD
    plus accept.anchor), unless that key is set for it already: the two rows differ only in the
    anchor (e.g. the x2 world's `decoder.mulo_sd.draft.window=8` sets both drafters)."""
    own = {o.split("=", 1)[0] for o in overrides if o.startswith("decoder.mulo_sd_anchored.")}
    extra = [o.replace("decoder.mulo_sd.", "decoder.mulo_sd_anchored.", 1) for o in overrides
             if o.startswith("decoder.mulo_sd.")]
    return [*overrides, *(o for o in extra if o.split("=", 1)[0] not in own)]


def compose_config(model: str, overrides: Sequence[str], experiment: str | None = None) -> Any:
    """The harness config (optionally an experiment) on `model`, GenEval and FID evaluators; the
    main table's decoders take `decoder.mulo_sd.*` overrides for both MuLo-SD rows (`mirrored`)."""
    overrides = mirrored(overrides) if experiment is None else list(overrides)
    keys = {o.split("=", 1)[0].lstrip("+") for o in overrides}
    sized = [f"{k}={v}" for k, v in RANDOM_LIKE_SHAPES.items() if model == "random" and k not in keys]
    extra = [f"+experiment={experiment}"] if experiment else [f"decoder=[{','.join(MAIN)}]"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=[
            *extra, f"model={model}", "evaluator=[geneval_shapes,fid_shapes]",
            "evaluator.geneval_shapes.show_progress=false", "evaluator.fid_shapes.show_progress=false",
            *sized, *overrides])


def summarise(stats: Sequence[DecodeStats]) -> dict[str, float]:
    """Per-image means of the counters, step compression and the MuLo-SD extras."""
    n, target = len(stats), sum(s.target_forwards for s in stats)
    extra = lambda key: sum(s.extra.get(key, 0.0) for s in stats)  # noqa: E731
    verify = extra("verify_forwards")
    proposed = sum(s.proposed for s in stats)
    return {"target": target / n, "drafter": sum(s.drafter_forwards for s in stats) / n,
            "verify": verify / n, "resample": extra("resample_forwards") / n,
            "compression": sum(s.tokens for s in stats) / target,
            "accept": sum(s.accepted for s in stats) / proposed if proposed else float("nan"),
            "islands_per_step": extra("islands") / verify if verify else float("nan"),
            "island_size": extra("resample_set") / extra("islands") if extra("islands") else float("nan"),
            "island_max": max((s.extra.get("island_size_max", 0.0) for s in stats), default=0.0)}


def fid_score(evaluator: Any, models: ModelBundle, specs: Sequence[SampleSpec], tokens: torch.Tensor,
              folder: Path) -> float:
    """FID of the decoded images against the shapes ground truth (NaN if it cannot run)."""
    sample_set = SampleSet(folder)
    images = models.target.decode(tokens.to(models.target.device)).permute(0, 2, 3, 1).cpu().numpy()
    for spec, image in zip(specs, images):
        sample_set.write(spec, image, {"batch_id": "0", "batch_latency_s": 0.0, "target_forwards": 1, "tokens": 1})
    try:
        summary = evaluator.evaluate(sample_set).summary
    except Exception as err:  # noqa: BLE001  (missing Inception weights etc.: report, keep going)
        log.warning("FID unavailable: %s", err)
        return float("nan")
    row = summary[summary.metric == "fid"]
    return float(row.value.iloc[0]) if len(row) else float("nan")


def quality_sample(decoder: Any, models: ModelBundle, specs: Sequence[SampleSpec], timed: torch.Tensor,
                   timed_stats: Sequence[DecodeStats], batch: int, device: torch.device
                   ) -> tuple[torch.Tensor, list[DecodeStats]]:
    """The timed images plus the rest of `specs` decoded (untimed) at `batch`."""
    if len(specs) <= len(timed):
        return timed, list(timed_stats)
    _, tokens, stats = decode_all(decoder, models, specs[len(timed):], batch, device)
    return torch.cat([timed, tokens]), [*timed_stats, *stats]


def measure(decoders: dict[str, Any], models: ModelBundle, specs: Sequence[SampleSpec], reps: int,
            device: torch.device, evaluators: dict[str, Any], fid: bool, tmp: Path,
            quality_specs: Sequence[SampleSpec] = (), quality_batch: int = 8) -> list[dict[str, Any]]:
    """Batch-1 timings (interleaved repetitions) and quality of every decoder; raster first.
    Quality is scored on `quality_specs` when given (they must start with `specs`)."""
    times: dict[str, list[float]] = {name: [] for name in decoders}
    outputs: dict[str, tuple[torch.Tensor, list[DecodeStats]]] = {}
    for dec in decoders.values():  # warm-up, untimed
        decode_all(dec, models, specs[:1], 1, device)
    for rep in range(reps):
        order = list(decoders)[rep % len(decoders):] + list(decoders)[: rep % len(decoders)]
        for name in order:
            spent, tokens, stats = decode_all(decoders[name], models, specs, 1, device)
            times[name].append(spent)
            outputs.setdefault(name, (tokens, stats))
    base = statistics.median(times["raster"])
    rows = []
    scored = list(quality_specs) or list(specs)
    for name in decoders:
        tokens, stats = outputs[name]
        q_tokens, q_stats = quality_sample(decoders[name], models, scored, tokens, stats, quality_batch, device)
        geneval, verdicts = geneval_verdicts(evaluators["geneval"], models, scored, q_tokens, q_stats,
                                             tmp / f"g_{name}")
        row = {"decoder": name, **summarise(stats), "s_img": statistics.median(times[name]) / len(specs),
               "speedup": base / statistics.median(times[name]), "geneval": geneval, "_verdicts": verdicts,
               "fid": fid_score(evaluators["fid"], models, scored, q_tokens, tmp / f"f_{name}") if fid else float("nan")}
        rows.append(row)
        log.info("%s: %s", name, _printable(row))
    return with_gaps(rows)


def _printable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items() if not k.startswith("_")}


def with_gaps(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add `gap` (GenEval minus raster's, on the same images) and `gap_se` (its paired standard
    error, evaluators/geneval_rules.paired_difference) to every row; one row must be raster."""
    raster = [row for row in rows if row["decoder"] == "raster"]
    if not raster:
        raise ValueError("with_gaps needs a raster row")
    reference = raster[0]["_verdicts"]
    for row in rows:
        if reference is None or row["_verdicts"] is None:
            row["gap"], row["gap_se"] = float("nan"), float("nan")
        else:
            row["gap"], row["gap_se"] = paired_difference(row["_verdicts"], reference)
    return rows


def table(title: str, rows: Sequence[dict[str, Any]]) -> str:
    cols = [("decoder", "<26", "s"), ("target", ">7", ".1f"), ("drafter", ">7", ".1f"), ("verify", ">6", ".1f"),
            ("resample", ">8", ".1f"), ("compression", ">11", ".2f"), ("s_img", ">7", ".3f"),
            ("speedup", ">7", ".2f"), ("accept", ">6", ".2f"), ("islands_per_step", ">7", ".2f"),
            ("island_size", ">7", ".1f"), ("geneval", ">7", ".3f"), ("gap", ">7", "+.3f"),
            ("gap_se", ">6", ".3f"), ("fid", ">7", ".1f")]
    head = " ".join(f"{(c if c != 'islands_per_step' else 'isl/stp')[:int(w[1:])]:{w}}" for c, w, _ in cols)
    lines = [title, head]
    for r in rows:  # format the value, then align the text (a sign option is not valid for text)
        lines.append(" ".join(f"{format(r[c], f if f != 's' else ''):{w}}" for c, w, f in cols))
    return "\n".join(lines)


def mulo_variant(model: str, overrides: Sequence[str], extra: Sequence[str]) -> Any:
    """MuLo-SD as configured, with `extra` overrides relative to decoder.mulo_sd (e.g. "accept.k=1")."""
    return _build(compose_config(model, [*overrides, *(f"decoder.mulo_sd.{o}" for o in extra)]).decoder.mulo_sd)


def ablation_decoders(model: str, overrides: Sequence[str],
                      only: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    """{table title: {decoder label: decoder}} composed from the ablation experiment configs
    (all of them, or those named in `only`)."""
    out: dict[str, dict[str, Any]] = {}
    for experiment in ABLATIONS:
        if only is not None and experiment not in only:
            continue
        cfg = compose_config(model, overrides, experiment)
        out[experiment] = {name: _build(node) for name, node in cfg.decoder.items()}
    if only is not None and "ablation_pooling" not in only:
        return out
    pooling: dict[str, Any] = {"raster": _build(compose_config(model, overrides).decoder.raster)}
    for k in POOLING["k"]:
        for tau in POOLING["tau"]:
            pooling[f"mulo k={k} tau={tau}"] = mulo_variant(model, overrides, [f"accept.k={k}", f"accept.tau={tau}"])
    out["ablation_pooling"] = pooling
    return out


def frontier_decoders(model: str, overrides: Sequence[str], taus: Sequence[float] | None = None) -> dict[str, Any]:
    """{label: decoder}: raster, then MuLo-SD at every FRONTIER window x acceptance rule, or, with
    `taus`, at each acceptance threshold tau (k and everything else as configured)."""
    out: dict[str, Any] = {"raster": _build(compose_config(model, overrides).decoder.raster)}
    if taus:
        for tau in taus:
            out[f"tau {tau:g}"] = mulo_variant(model, overrides, [f"accept.tau={tau}"])
        return out
    for window in FRONTIER["windows"]:
        for suffix, rule in FRONTIER["rules"].items():
            out[f"window {window}{suffix}"] = mulo_variant(model, overrides, [f"resampler.window={window}", *rule])
    return out


def _meets(row: dict[str, Any], raster: dict[str, Any], goal: dict[str, float]) -> tuple[bool, bool, bool]:
    """(forward reduction, wall-clock speed-up, GenEval gap) goals met by one row."""
    reduction = raster["target"] / row["target"] if row["target"] else float("inf")
    return reduction >= goal["forwards"], row["speedup"] >= goal["speedup"], row["gap"] >= goal["gap"]


def _describe(row: dict[str, Any]) -> str:
    return f"{row['decoder']} ({row['speedup']:.2f}x, gap {row['gap']:+.3f} +- {row['gap_se']:.3f})"


def goal_verdict(rows: Sequence[dict[str, Any]], goal: dict[str, float] = GOAL) -> list[str]:
    """The goal read off timed rows with gaps (one of them raster): lines naming the rows that
    meet all of it, the fastest row within the gap, the best gap at the speed-up goal and the
    Pareto front (no other row is both faster and closer to raster)."""
    raster = next((r for r in rows if r["decoder"] == "raster"), None)
    if raster is None:
        raise ValueError("goal_verdict needs a raster row")
    others = [r for r in rows if r is not raster]
    checks = [(r, _meets(r, raster, goal)) for r in others]  # (forwards, speed-up, gap) per row
    met = [r for r, ok in checks if all(ok)]
    fast = [r for r, ok in checks if ok[1]]
    within = [r for r, ok in checks if ok[2]]
    front = [r for r in others if not any(o["speedup"] > r["speedup"] and o["gap"] > r["gap"] for o in others)]
    head = (f"goal (>= {goal['forwards']:g}x fewer target forwards, >= {goal['speedup']:g}x wall-clock, "
            f"GenEval gap >= {goal['gap']:+.3f})")
    return [
        f"{head}: " + ("met by " + ", ".join(_describe(r) for r in met) if met else "not met by any row"),
        "fastest within the gap: " + (_describe(max(within, key=lambda r: r["speedup"])) if within else "none"),
        f"best gap at >= {goal['speedup']:g}x: " + (_describe(max(fast, key=lambda r: r["gap"])) if fast else "none"),
        "Pareto front (speed-up vs gap): " + ", ".join(_describe(r) for r in
                                                      sorted(front, key=lambda r: -r["speedup"])),
    ]


def low_view(decoder: Any, models: ModelBundle, high: torch.Tensor) -> torch.Tensor:
    """D_r with the decoder's own down-sampler: high-res tokens [B, N] -> low-res [B, n_low]."""
    draft = decoder.draft.bind(models)
    ctx = Context(models=models, cond=None, sampling=decoder.sampling, gens=[],  # type: ignore[arg-type]
                  device=high.device)
    return draft.upsampler.down(high.view(-1, *models.target.grid), ctx).flatten(1)


def decode_with_oracle(decoder: Any, models: ModelBundle, specs: Sequence[SampleSpec], reference: torch.Tensor,
                       batch: int, device: torch.device) -> tuple[torch.Tensor, list[DecodeStats]]:
    """Decode with the drafter replaced by a ReplayModel of D_r(reference [n, N]) per batch."""
    replay = ReplayModel(models.drafter)
    oracle = ModelBundle(name=f"{models.name}+oracle", target=models.target, conditioner=models.conditioner,
                         drafter=replay)  # type: ignore[arg-type]

    def before(start: int, stop: int) -> None:
        replay.replay(low_view(decoder, models, reference[start:stop].to(device)))

    _, tokens, stats = decode_all(decoder, oracle, specs, batch, device, before)
    return tokens, stats


DIAGNOSES = {  # label -> (overrides of decoder.mulo_sd, oracle drafter)
    "drafter": ([], False),
    "oracle draft": ([], True),
    "k=1 tau=1 (resampler alone)": (["accept.k=1", "accept.tau=1.0"], False),
    "serial: drafter": (["resampler.schedule=serial"], False),
    "serial: oracle draft": (["resampler.schedule=serial"], True),
    "serial: k=1 tau=1": (["resampler.schedule=serial", "accept.k=1", "accept.tau=1.0"], False),
    "window 4: drafter": (["resampler.window=4"], False),
    "window 4: k=1 tau=1": (["resampler.window=4", "accept.k=1", "accept.tau=1.0"], False),
}


def diagnose(model: str, overrides: Sequence[str], models: ModelBundle, specs: Sequence[SampleSpec],
             device: torch.device, evaluator: Any, batch: int, tmp: Path) -> list[dict[str, Any]]:
    """The --diagnose table (module docstring): raster first, then every DIAGNOSES row; forwards,
    acceptance and GenEval (no timing: an oracle drafter costs nothing)."""
    raster = _build(compose_config(model, overrides).decoder.raster)
    _, reference, raster_stats = decode_all(raster, models, specs, batch, device)
    outputs = {"raster": (reference, raster_stats)}
    for label, (extra, oracle) in DIAGNOSES.items():
        decoder = mulo_variant(model, overrides, extra)
        if oracle:
            outputs[label] = decode_with_oracle(decoder, models, specs, reference, batch, device)
        else:
            outputs[label] = decode_all(decoder, models, specs, batch, device)[1:]
    rows = []
    for i, (label, (tokens, stats)) in enumerate(outputs.items()):
        geneval, verdicts = geneval_verdicts(evaluator, models, specs, tokens, stats, tmp / f"d{i}")
        row = {"decoder": label, **summarise(stats), "s_img": float("nan"), "speedup": float("nan"),
               "geneval": geneval, "_verdicts": verdicts, "fid": float("nan")}
        rows.append(row)
        log.info("%s: %s", label, _printable(row))
    return with_gaps(rows)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["random", "shapes", "shapes_x2"], default="shapes")
    ap.add_argument("--images", type=int, default=16)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--fid", action="store_true", help="score FID (shapes ground truth) beside GenEval")
    ap.add_argument("--quality-images", type=int, default=0,
                    help="score GenEval/FID on this many images (>= --images; 0: the timed ones)")
    ap.add_argument("--quality-batch", type=int, default=8, help="batch of the untimed quality decode")
    ap.add_argument("--ablations", action="store_true", help="also run the paper's ablations (§10.2)")
    ap.add_argument("--only", nargs="+", default=None, choices=[*ABLATIONS, "ablation_pooling"],
                    help="with --ablations: run only these ablation tables")
    ap.add_argument("--diagnose", action="store_true",
                    help="add the table that splits MuLo-SD's quality loss (oracle drafter, resampler alone)")
    ap.add_argument("--frontier", action="store_true",
                    help="time MuLo-SD's resampler windows x acceptance rules and print the goal verdict")
    ap.add_argument("--frontier-taus", type=float, nargs="+", default=None, metavar="TAU",
                    help="with --frontier: sweep the acceptance threshold over these values instead")
    ap.add_argument("--no-main", action="store_true",
                    help="skip the main table (with --ablations, --frontier or --diagnose)")
    ap.add_argument("--seed", type=int, default=HELD_OUT_SEED,
                    help="global seed of the timed and quality images (default: the held-out seed; "
                         "0 is the tuning sample the shipped defaults were chosen on)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. decoder.mulo_sd.accept.tau=0.2")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    for noisy in ("evaluators", "harness.samples", "baselines.upsamplers"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    if a.threads:
        torch.set_num_threads(a.threads)
    if any(o.lstrip("+~").split("=")[0] == "seed" for o in a.overrides):
        ap.error("set the images' seed with --seed N, not a Hydra override seed=N")
    overrides = [*a.overrides, f"seed={a.seed}"]
    cfg = compose_config(a.model, overrides)
    device = _device(a.device)
    bundle = _build(cfg.model, drop=("name", "sampling")).to(device)
    decoders = {name: _build(cfg.decoder[name]) for name in MAIN}
    models = guided(bundle, decoders["raster"].sampling)
    if a.only and not a.ablations:
        ap.error("--only selects ablation tables: add --ablations")
    if a.frontier_taus and not a.frontier:
        ap.error("--frontier-taus selects the frontier's rows: add --frontier")
    if a.no_main and not (a.ablations or a.frontier or a.diagnose):
        ap.error("--no-main leaves nothing to run: add --ablations, --frontier or --diagnose")
    if a.quality_images and a.quality_images < a.images:
        ap.error(f"--quality-images {a.quality_images} must be 0 or >= --images {a.images}")
    # shapes(n) is a prefix of shapes(m) for n < m: the timed images are the first quality images
    quality = plan(shapes(a.quality_images), images_per_prompt=1, global_seed=cfg.seed) if a.quality_images else []
    specs = quality[: a.images] if quality else plan(shapes(a.images), images_per_prompt=1, global_seed=cfg.seed)
    evaluators = {"geneval": _build(cfg.evaluator.geneval_shapes), "fid": _build(cfg.evaluator.fid_shapes)}
    print(f"model={a.model} images={a.images} reps={a.reps} batch=1 device={device} "
          f"threads={torch.get_num_threads()} sampling={decoders['raster'].sampling} "
          f"quality_images={len(quality) or a.images} seed={cfg.seed}")
    with tempfile.TemporaryDirectory() as tmp:
        note = sample_note(len(quality) or len(specs))
        if not a.no_main:
            rows = measure(decoders, models, specs, a.reps, device, evaluators, a.fid, Path(tmp) / "main",
                           quality, a.quality_batch)
            print(table("== main (batch 1)", rows), flush=True)
            print(goal_verdict([r for r in rows if r["decoder"] in ("raster", *MULO_ROWS)])[0], flush=True)
            if note:
                print(note, flush=True)
        if a.ablations:
            for title, decs in ablation_decoders(a.model, overrides, a.only).items():
                rows = measure(decs, models, specs, a.reps, device, evaluators, False, Path(tmp) / title,
                               quality, a.quality_batch)
                print(table(f"== {title}", rows), flush=True)
        if a.frontier:
            frontier = frontier_decoders(a.model, overrides, a.frontier_taus)
            rows = measure(frontier, models, specs, a.reps, device, evaluators, False, Path(tmp) / "frontier",
                           quality, a.quality_batch)
            print(table("== frontier (batch 1)", rows), *goal_verdict(rows), *([note] if note else []), sep="\n",
                  flush=True)
        if a.diagnose:
            rows = diagnose(a.model, overrides, models, quality or specs, device, evaluators["geneval"],
                            a.quality_batch, Path(tmp) / "diagnose")
            print(table("== diagnose (untimed; quality images)", rows), flush=True)


if __name__ == "__main__":
    main()
