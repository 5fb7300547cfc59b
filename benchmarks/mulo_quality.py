"""Quality sweep: shapes-GenEval of raster and of decoder variants on many prompts, each with its
paired gap to raster, as one pipeline run (harness.run.run with `timing.images=0`: every image
decoded once, untimed, at --batch; speed evaluator for the forward counts, geneval_shapes for the
verdicts) under --out, rendered with harness.report. `--timed N` times the first N images.

    python benchmarks/mulo_quality.py [--model shapes_x2] [--prompts 1536] [--start 0] [--seed 2]
                                      [--batch 256] [--device auto] [--threads N] [--out DIR]
                                      [--variant NAME=DECODER[:KEY=VALUE,...] ...] [--set KEY=VALUE ...]
                                      [--samples DIR] [--fid] [--timed N]

A variant names a decoder of the harness config (raster, zipar, mulo_sd, ...) and overrides of that
decoder's keys, e.g. `tau0=mulo_sd:accept.tau=0.0,draft.window=8`; it becomes decoder NAME of the
run. Raster always runs. `--set` overrides the config of every row (`--set decoder.mulo_sd.KEY=V`
reaches every variant of mulo_sd). Each row's per-image verdicts (sample_id, tag, correct, reason)
are in <out>/per_sample/NAME/geneval.csv, its images in <out>/samples/NAME (or under --samples).
`--samples DIR` keeps the SampleSets in DIR: a later run with other variants finds raster's images
complete and does not decode them again, and a set made under another target, sampling or seed is
refused by its binding. `--start N` scores prompts [N, N + prompts) (`dataset_start`): image seeds
follow prompt ids, so two runs' verdicts join into one larger sample.

Besides GenEval each row gives the share of images failing each kind of GenEval clause (an image can
fail several): `missing` (an asked-for object is not found: fewer than its count), `extra` (more
objects than a counting prompt allows), `color` (found, not of the asked colour) and `position`
(found, not in the asked relation). Images are drawn at the held-out seed 2 (benchmarks/goal.py).

`--fid` also scores FID and KID against the ground-truth renders (fid_shapes), adds raster from
another draw of the image seeds (`raster_redrawn`: the metrics' own noise at this N) and prints the
quality verdict of each row (benchmarks/goal.py: GenEval gap >= -0.02 and FID within 10% of raster's
or KID within the noise band).

`--timed N` times the first N images of the plan at batch 1 (timing.images = N, timing.reps = 2,
decoders interleaved) and adds each row's speed-up over raster and its timing noise; the other
images are decoded untimed as before. Images already in a --samples set are not decoded again, so
they are not timed either: time into a folder of its own.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Sequence

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import (CONF, DRAFTER_FORWARDS, FID, GAP, GENEVAL, KID, NOISE, SPEEDUP,  # noqa: E402
                               TARGET_FORWARDS, compose_config, decoder_table, header, mirrored, out_dir,
                               quiet, run_job, variant)
from benchmarks.goal import GOAL, HELD_OUT_SEED, REDRAWN, detail, rows_of  # noqa: E402
from harness.report.specs import MetricSpec  # noqa: E402

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
# GenEval's failed-clause reasons (evaluators/geneval_rules.py) by kind; the patterns exclude each other
FAILURES = (("missing", re.compile(r"^expected .+>=\d+, found \d+$")),
            ("extra", re.compile(r"^expected .+<\d+, found \d+$")),
            ("color", re.compile(r"^expected .+>=\d+, found \d+ \w+; and ")),
            ("position", re.compile(r"^(no target for .+ to be |expected .+ (left of|right of|above|below) target, found )")))
SHARES = tuple(MetricSpec(f"fail_{k}", k, f"fail_{k}", decimals=3, higher_is_better=False) for k, _ in FAILURES)


def parse_variant(text: str) -> tuple[str, str, list[str]]:
    """'NAME=DECODER[:k=v,k=v]' -> (NAME, DECODER, ['k=v', ...])."""
    name, sep, rest = text.partition("=")
    decoder, _, overrides = rest.partition(":")
    if not sep or not name or not decoder or name == "raster":
        raise ValueError(f"--variant {text!r}: expected NAME=DECODER[:KEY=VALUE,...] with NAME other than raster")
    keys = [o for o in overrides.split(",") if o]
    if any("=" not in k for k in keys):
        raise ValueError(f"--variant {text!r}: every override needs KEY=VALUE")
    return name, decoder, keys


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


def with_shares(summary: pd.DataFrame, run_dir: Path) -> pd.DataFrame:
    """The run's summary plus one `fail_<kind>` row per decoder, from its per-image verdicts."""
    rows = []
    for decoder, first in summary.groupby("decoder", sort=False).head(1).set_index("decoder").iterrows():
        verdicts = pd.read_csv(run_dir / "per_sample" / str(decoder) / "geneval.csv")
        rows += [{**first.to_dict(), "decoder": decoder, "evaluator": "geneval", "metric": f"fail_{kind}",
                  "subset": "all", "value": share, "stderr": float("nan"), "n": len(verdicts),
                  "higher_is_better": False} for kind, share in failure_shares(verdicts).items()]
    return pd.concat([summary, pd.DataFrame(rows)], ignore_index=True)


def main(argv: Sequence[str] | None = None) -> pd.DataFrame:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = ap.add_argument
    add("--model", choices=["random", "shapes", "shapes_x2"], default="shapes_x2")
    add("--prompts", type=int, default=1536)
    add("--start", type=int, default=0, help="skip the first START prompts (dataset_start)")
    add("--seed", type=int, default=HELD_OUT_SEED, help="global seed of the images")
    add("--batch", type=int, default=256, help="decode batch (one image seed per image)")
    add("--device", default="auto")
    add("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    add("--out", type=Path, default=None, help="run folder (default: results/benchmarks/mulo_quality/<time>)")
    add("--samples", type=Path, default=None, help="SampleSets folder to reuse (samples_dir; default: <out>/samples)")
    add("--variant", action="append", default=None, metavar="NAME=DECODER[:K=V,...]",
        help="a row (repeatable; default: the x2 world's rows in the README)")
    add("--set", action="append", default=[], metavar="KEY=VALUE", help="a Hydra override of every row (repeatable)")
    add("--fid", action="store_true", help="also FID/KID, raster_redrawn and the quality verdict")
    add("--timed", type=int, default=0, help="time the first N images at batch 1 (speed-up, noise)")
    a = ap.parse_args(argv)
    quiet()
    try:
        rows = [parse_variant(v) for v in (a.variant or X2_VARIANTS)]
        if a.fid and REDRAWN not in {n for n, _, _ in rows}:
            rows.insert(0, (REDRAWN, REDRAWN, []))
    except ValueError as err:
        ap.error(str(err))
    if any("=" not in o for o in a.set):
        ap.error(f"--set needs KEY=VALUE, got {[o for o in a.set if '=' not in o]}")
    if a.prompts < 1 or a.batch < 1 or a.start < 0 or not 0 <= a.timed <= a.prompts:
        ap.error("--prompts and --batch must be >= 1, --start >= 0 and --timed in [0, --prompts]")
    known = {p.stem for p in (CONF / "decoder").glob("*.yaml")}
    unknown = sorted({d for _, d, _ in rows} - known)
    if unknown:
        raise ValueError(f"no decoder {unknown[0]!r}; the decoders are {sorted(known)} (conf/decoder/)")
    overrides = ["decoder=[raster]", "name=mulo_quality", f"seed={a.seed}", f"dataset.n={a.start + a.prompts}",
                 f"dataset_start={a.start}", f"dataset_limit={a.prompts}", f"batch_size={a.batch}",
                 f"timing.images={a.timed}", "timing.reps=2", "timing.batch_size=1", f"device={a.device}",
                 f"evaluator=[speed,geneval_shapes{',fid_shapes' if a.fid else ''}]",
                 *(["evaluator.fid_shapes.show_progress=false"] if a.fid else []),
                 "evaluator.geneval_shapes.show_progress=false", *([f"threads={a.threads}"] if a.threads else []),
                 *([f"samples_dir={a.samples}"] if a.samples else []),
                 *(o for name, decoder, keys in rows for o in variant(name, decoder, keys)), *a.set]
    for base in {d for _, d, _ in rows}:  # --set decoder.<base>.KEY=V reaches every variant of base
        overrides = mirrored(overrides, [n for n, d, _ in rows if d == base], base)
    names = {"raster", *(n for n, _, _ in rows)}
    overrides = [o for o in overrides if not o.startswith("decoder.") or o.split(".")[1] in names]
    out = out_dir(a.out, "mulo_quality")
    print(header(model=a.model, start=a.start, prompts=a.prompts, seed=a.seed, batch=a.batch, device=a.device,
                 out=out) + "".join(f" {o}" for o in a.set), flush=True)
    summary = with_shares(run_job(compose_config(overrides, a.model), out), out)
    labels = {"raster": "raster", **{n: n for n, _, _ in rows}}
    columns = (TARGET_FORWARDS, DRAFTER_FORWARDS, *((SPEEDUP, NOISE) if a.timed else ()), GENEVAL, GAP,
               *((FID, KID) if a.fid else ()), *SHARES)
    print(decoder_table(summary, f"quality ({a.model}, seed {a.seed}, prompts {a.start}..{a.start + a.prompts})",
                        labels, columns), flush=True)
    if a.fid:
        print(*quality_verdicts(rows_of(summary)), sep="\n", flush=True)
    return summary


def quality_verdicts(rows: list[dict]) -> list[str]:
    """One line per row: whether it keeps raster's quality (GenEval gap and image detail)."""
    raster = next(r for r in rows if r["decoder"] == "raster")
    redrawn = next((r for r in rows if r["decoder"] == REDRAWN), None)
    lines = []
    for row in rows:
        if row["decoder"] in ("raster", REDRAWN):
            continue
        kept = detail(row, raster, GOAL, redrawn)
        geneval = row["gap"] >= GOAL["gap"]
        verdict = "keeps quality" if geneval and kept else "loses " + " and ".join(
            [w for w, lost in (("GenEval", not geneval), ("detail", kept is False)) if lost] or ["nothing measured"])
        lines.append(f"{row['decoder']}: {verdict} (gap {row['gap']:+.3f} +- {row['gap_se']:.3f}, FID {row['fid']:.1f} "
                     f"vs {raster['fid']:.1f}, KID {row['kid'] - raster['kid']:+.4f} vs raster)")
    return lines


if __name__ == "__main__":
    main()
