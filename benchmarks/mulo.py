"""MuLo-SD against raster, SJD, EAGLE-2, LANTERN and ZipAR, then the paper's ablations, a frontier of
operating points and a diagnosis of MuLo-SD's quality loss, each table one pipeline run
(harness.run.run: interleaved, repeated batch-1 timing; speed and shapes-GenEval evaluators) under
<--out>/<table>/, rendered with harness.report.

    python benchmarks/mulo.py [--model shapes|shapes_x2|random] [--images 16] [--reps 2] [--fid]
                              [--quality-images 96] [--quality-batch 8] [--ablations [--only NAME ...]]
                              [--diagnose] [--frontier [--frontier-taus TAU ...]] [--no-main] [--seed 2]
                              [--device auto] [--threads N] [--out DIR] [hydra overrides ...]

main (+experiment=main): raster, SJD, EAGLE-2, LANTERN, ZipAR, MuLo-SD and mulo_sd_anchored; per decoder
target / drafter / verify / resample forwards per image, step compression, batch-1 latency,
speed-up vs raster with its 95% interval, timing_noise, acceptance, islands, GenEval with its
paired gap to raster (+- standard error), FID with --fid; then the goal verdict (benchmarks/goal.py).
--ablations: +experiment=ablation_upsampling / _local / _parallel / _open_questions, and the
pooling grid k x tau. --frontier: MuLo-SD at resampler windows 2, 3, 4, 8 with the configured rule
and with k = 1, tau = 1 (or at each --frontier-taus threshold), with the verdict. --diagnose
(untimed): MuLo-SD with its drafter, with an oracle drafter (benchmarks/oracle.py), with k = 1,
tau = 1 (the resampler alone), serial resampling and window 4.
Timing needs few images, a 2-point GenEval gap many: the first --images images of the plan are
timed at batch 1 (`timing.images`), all --quality-images are scored, the rest decoded untimed at
--quality-batch. `decoder.mulo_sd.*` overrides reach every MuLo-SD row. Images are drawn at the
held-out seed 2 (benchmarks/goal.py): tune at seed 0 or 1, quote seed 2 with --quality-images 1536.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import (compose_config, decoder_table, header, mirrored, out_dir, quiet,  # noqa: E402
                               run_job, variant)
from benchmarks.goal import HELD_OUT_SEED, REDRAWN, goal_verdict, rows_of, sample_note  # noqa: E402
from benchmarks.oracle import DIAGNOSES, diagnose_rows  # noqa: E402
from harness.report.specs import METHOD_LABELS, TABLES  # noqa: E402

MAIN = {**METHOD_LABELS, "mulo_sd_anchored": "MuLo-SD anchored (redraws near the draft token)",
        REDRAWN: "raster, another draw of the seeds (the metrics' noise)"}
ABLATIONS = ("ablation_upsampling", "ablation_local", "ablation_parallel", "ablation_open_questions")
POOLING = {"k": (1, 4, 16, 64), "tau": (0.05, 0.1, 0.3)}
FRONTIER = {"windows": (2, 3, 4, 8), "rules": {"": [], " k=1 tau=1": ["accept.k=1", "accept.tau=1.0"]}}


def key(text: str) -> str:
    """A config key for a row label: 'window 2 k=1 tau=1' -> 'window_2_k1_tau1', '0.05' -> '0p05'."""
    return "".join(c if c.isalnum() else "_" if c == " " else "p" if c == "." else "" for c in text)


def mulo_rows(labels: dict[str, list[str]]) -> tuple[list[str], dict[str, str]]:
    """Overrides adding raster and one MuLo-SD variant per label (label -> overrides relative to
    decoder.mulo_sd), and {config name: label}."""
    names = {key(label if label.startswith("mulo") else f"mulo {label}"): label for label in labels}
    extra = [o for n, label in names.items() for o in variant(n, "mulo_sd", labels[label])]
    return ["decoder=[raster]", *extra], {"raster": "Raster AR", **names}


def pooling_rows() -> dict[str, list[str]]:  # the pooling grid k x tau
    return {f"mulo k={k} tau={t}": [f"accept.k={k}", f"accept.tau={t}"]
            for k in POOLING["k"] for t in POOLING["tau"]}


def frontier_rows(taus: Sequence[float] | None = None) -> dict[str, list[str]]:  # windows x rules, or taus
    if taus:
        return {f"tau {t:g}": [f"accept.tau={t}"] for t in taus}
    return {f"window {w}{suffix}": [f"resampler.window={w}", *rule] for w in FRONTIER["windows"]
            for suffix, rule in FRONTIER["rules"].items()}


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = ap.add_argument
    add("--model", choices=["random", "shapes", "shapes_x2"], default="shapes")
    add("--images", type=int, default=16, help="timed images (batch 1) per decoder")
    add("--reps", type=int, default=2, help="timed decodes of each image (timing.reps)")
    add("--fid", action="store_true", help="score FID (shapes ground truth) beside GenEval")
    add("--quality-images", type=int, default=0, help="images scored (>= --images; 0: the timed ones)")
    add("--quality-batch", type=int, default=8, help="batch of the untimed images")
    add("--ablations", action="store_true", help="also run the paper's ablations")
    add("--only", nargs="+", default=None, choices=[*ABLATIONS, "ablation_pooling"], help="with --ablations")
    add("--diagnose", action="store_true", help="the table that splits MuLo-SD's quality loss")
    add("--frontier", action="store_true", help="MuLo-SD's operating points and the goal verdict")
    add("--frontier-taus", type=float, nargs="+", default=None, metavar="TAU", help="with --frontier")
    add("--no-main", action="store_true", help="skip the main table")
    add("--seed", type=int, default=HELD_OUT_SEED, help="global seed of the images (default: held out)")
    add("--device", default="auto")
    add("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    add("--out", type=Path, default=None, help="folder of the runs (default: results/benchmarks/mulo/<time>)")
    add("overrides", nargs="*", help="Hydra overrides, e.g. decoder.mulo_sd.accept.tau=0.2")
    a = ap.parse_args(argv)
    for wrong, message in (
            (any(o.lstrip("+~").split("=")[0] == "seed" for o in a.overrides),
             "set the images' seed with --seed N, not a Hydra override seed=N"),
            (a.only and not a.ablations, "--only selects ablation tables: add --ablations"),
            (a.frontier_taus and not a.frontier, "--frontier-taus selects the frontier's rows: add --frontier"),
            (a.no_main and not (a.ablations or a.frontier or a.diagnose),
             "--no-main leaves nothing to run: add --ablations, --frontier or --diagnose"),
            (0 < a.quality_images < a.images, f"--quality-images must be 0 or >= --images {a.images}")):
        if wrong:
            ap.error(message)
    return a


def main(argv: Sequence[str] | None = None) -> None:
    a = parse(argv)
    quiet()
    images = a.quality_images or a.images
    common = [f"seed={a.seed}", f"dataset.n={images}", "dataset_limit=null", f"batch_size={a.quality_batch}",
              "timing.batch_size=1", f"timing.reps={a.reps}", f"device={a.device}", "warmup_batches=1",
              f"evaluator=[speed,geneval_shapes{',fid_shapes' if a.fid else ''}]",
              "evaluator.geneval_shapes.show_progress=false", *([f"threads={a.threads}"] if a.threads else [])]
    timed = [*common, f"timing.images={a.images}"]
    out = out_dir(a.out, "mulo")
    threshold = compose_config([*timed, *a.overrides], a.model).timing.noise_threshold
    print(header(model=a.model, images=a.images, reps=a.reps, batch=1, device=a.device, threads=a.threads,
                 quality_images=images, out=out, seed=a.seed), flush=True)
    note = sample_note(images)

    def table(name: str, title: str, extra: list[str], labels: dict[str, str], mulo: list[str] | None = None,
              untimed: bool = False) -> list[dict]:
        base = [*(common + ["timing.images=0"] if untimed else timed), *extra]
        names = list(compose_config(base, a.model).decoder)
        overrides = mirrored([*base, *a.overrides], mulo or [n for n in names if n.startswith("mulo_")])
        if "mulo_sd" not in names:  # e.g. ablation_local: its MuLo-SD rows took the overrides
            overrides = [o for o in overrides if not o.startswith("decoder.mulo_sd.")]
        cfg = compose_config(overrides, a.model)
        summary = run_job(cfg, out / name)
        print(decoder_table(summary, f"{title} ({cfg.model.name}, seed {a.seed})", labels), flush=True)
        return rows_of(summary)

    if not a.no_main:
        main_rows = ["+experiment=main"]
        if a.fid:  # raster against itself at the same N: FID/KID's own noise band (benchmarks/goal.py)
            names = list(compose_config([*timed, *main_rows], a.model).decoder)
            main_rows.append(f"decoder=[{','.join([names[0], REDRAWN, *names[1:]])}]")
        rows = table("main", "main (batch 1)", main_rows, MAIN)
        print(goal_verdict([r for r in rows if r["decoder"] in ("raster", REDRAWN, "mulo_sd", "mulo_sd_anchored")],
                           noise_threshold=threshold)[0], *([note] if note else []), sep="\n", flush=True)
    if a.ablations:
        for name in ABLATIONS:
            if a.only is None or name in a.only:
                table(name, TABLES.get(name).title if name in TABLES else name, [f"+experiment={name}"],
                      dict(TABLES[name].methods) if name in TABLES else {})
        if a.only is None or "ablation_pooling" in a.only:
            extra, labels = mulo_rows(pooling_rows())
            table("ablation_pooling", TABLES["ablation_pooling"].title, ["name=ablation_pooling", *extra], labels)
    if a.frontier:
        extra, labels = mulo_rows(frontier_rows(a.frontier_taus))
        if a.fid:  # with the metrics' noise band
            extra, labels = ["decoder=[raster,raster_redrawn]", *extra[1:]], {**labels, REDRAWN: MAIN[REDRAWN]}
        rows = table("frontier", "frontier (batch 1)", ["name=mulo_frontier", *extra], labels)
        rows = [{**r, "decoder": r["decoder"] if r["decoder"] in ("raster", REDRAWN) else labels[r["decoder"]]}
                for r in rows]
        print(*goal_verdict(rows, noise_threshold=threshold), *([note] if note else []), sep="\n", flush=True)
    if a.diagnose:
        extra, paths = diagnose_rows()
        table("diagnose", "diagnose (untimed; quality images)", ["decoder=[raster]", "name=mulo_diagnose", *extra],
              {"raster": "Raster AR", **{n: label for n, (label, _, _) in DIAGNOSES.items()}}, paths, untimed=True)


if __name__ == "__main__":
    main()
