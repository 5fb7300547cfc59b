"""Where MuLo-SD redraws, read from SampleSets a run already made (benchmarks/mulo_quality.py keeps
them under <out>/samples/<row>): per row the region figures (share redrawn, regions, seam length,
share changed, t0), on the shapes worlds the missing-object rates of raster, draft and final, the
one-pass tau curve, and the figures: a redraw panel per row (its first --panels images) and the tau
curves of the rows together. Nothing is decoded again.

    python benchmarks/mulo_redraws.py --model shapes --samples DIR --rows mulo_sd mulo_l0 \
        [--raster raster] [--panels 6] [--out DIR]
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.report.redraw_figures import draft_decoder, missing_rates, redraw_panels, tau_curves  # noqa: E402
from harness.report.redraws import redraws, region_figures, tau_curve  # noqa: E402
from harness.store.samples import SampleSet  # noqa: E402

log = logging.getLogger(__name__)


def row_figures(samples: SampleSet, decode, raster: SampleSet | None) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Region figures, mean t0 share and (shapes worlds) missing-object rates of one row."""
    records = redraws(samples)
    out = region_figures(records)
    cells = records[0].redrawn.size
    out["t0_share"] = float(np.mean([min(r.first_rejection, cells) / cells for r in records]))
    out["rejected_share"] = float(np.mean([r.rejected.mean() for r in records]))
    if decode is not None:
        out.update({f"missing_{k}": v for k, v in missing_rates(samples, decode, raster).items()})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the model the sets were made with (shapes, shapes_x2, ...)")
    ap.add_argument("--samples", type=Path, required=True, help="folder of the rows' SampleSets")
    ap.add_argument("--rows", nargs="+", required=True, help="MuLo-SD rows (sub-folders of --samples)")
    ap.add_argument("--raster", default=None, help="the raster row's sub-folder (raster column, missing rate)")
    ap.add_argument("--panels", type=int, default=6, help="images per redraw panel")
    ap.add_argument("--out", type=Path, default=None, help="figure folder (default: --samples)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    out = args.out or args.samples
    out.mkdir(parents=True, exist_ok=True)
    raster = SampleSet(args.samples / args.raster) if args.raster else None
    decode = draft_decoder(args.model)
    curves = []
    print("| row | images | rejected | t0 / N | redrawn | regions | seam (cell edges) | changed | "
          "missing: raster | draft | final |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.rows:
        samples = SampleSet(args.samples / name)
        f = row_figures(samples, decode, raster)
        missing = [f.get(f"missing_{k}", float("nan")) for k in ("raster", "draft", "final")]
        print(f"| {name} | {f['images']:.0f} | {f['rejected_share']:.1%} | {f['t0_share']:.2f} | "
              f"{f['share_redrawn']:.1%} | {f['regions']:.2f} | {f['seam_length']:.1f} | "
              f"{f.get('share_changed', float('nan')):.1%} | " + " | ".join(f"{m:.1%}" for m in missing) + " |")
        redraw_panels(samples, f"{args.model}: {name}", out / f"redraws_{args.model}_{name}", raster, decode,
                      args.panels)
        try:
            curves.append((name, tau_curve(samples)))
        except ValueError as err:
            log.warning("%s: %s", name, err)
    for name, curve in curves:
        print(f"\ntau curve of {name} ({curve.images} images): tau | rejected | t0 / N | redrawn | target fwd")
        for t, r, f0, d, fw in zip(curve.tau, curve.rejected, curve.first, curve.redrawn, curve.target_forwards):
            print(f"| {t:g} | {r:.2%} | {f0:.2f} | {d:.1%} | {fw:.1f} |")
    if curves:
        tau_curves(curves, args.model, out / f"tau_curve_{args.model}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
