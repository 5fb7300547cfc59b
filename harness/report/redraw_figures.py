"""Figures of MuLo-SD's redraw records (harness/report/redraws.py reads them):

- redraw_panels: per image (rows) the raster image of the same prompt and seed, the up-sampled
  draft, its rejected cells, the redraw region (both over the draft), the final image and the
  cells whose token changed (over the final image);
- tau_curves: per labelled set, the one-pass tau curve: rejected and redrawn shares of the image,
  and the target forwards, against tau (symmetric-log axis: tau = 0 is shown).
"""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from matplotlib.figure import Figure

from harness.report.figures import Panel, save
from harness.report.redraws import Redraw, TauCurve, redraws, region_figures, tau_curve
from harness.store.samples import SampleSet

Decode = Callable[[np.ndarray], np.ndarray]  # draft tokens [rows, cols] -> uint8 image [H, W, 3]
TINT = {"rejected": (230, 30, 30), "redrawn": (30, 120, 230), "changed": (250, 170, 0)}


def tinted(image: np.ndarray, cells: np.ndarray, color: tuple[int, int, int], alpha: float = 0.55) -> np.ndarray:
    """image uint8 [H, W, 3], cells [rows, cols] bool -> a copy with the cells' pixels blended
    towards `color` (H and W multiples of rows and cols)."""
    scale = (image.shape[0] // cells.shape[0], image.shape[1] // cells.shape[1])
    mask = np.kron(cells, np.ones(scale, dtype=bool))[..., None]
    blend = (1 - alpha) * image + alpha * np.asarray(color, dtype=np.float64)
    return np.where(mask, blend, image).round().astype(np.uint8)


def _blank(shape: tuple[int, ...]) -> np.ndarray:
    return np.full(shape, 255, dtype=np.uint8)


def redraw_panels(samples: SampleSet, title: str, stem: Path, raster: SampleSet | None = None,
                  decode: Decode | None = None, count: int = 6) -> list[Path]:
    """The first `count` images of a MuLo-SD set, one per row (module docstring). Without `decode`
    (no tokenizer at hand) the draft columns show the final image instead, labelled so; without a
    raster set (or its sample) the raster column is blank."""
    records = redraws(samples)[:count]
    texts = dict(samples.records()[["sample_id", "prompt"]].itertuples(index=False))
    raster_ids = set(raster.records()["sample_id"]) if raster is not None else set()
    heads = ["raster", "up-sampled draft" if decode else "final (draft not decoded)", "rejected cells",
             "redraw region", "final", "changed cells"]
    figure = Figure(figsize=(1.7 * len(heads) + 0.4, 1.8 * len(records) + 0.6), layout="constrained")
    axes = figure.subplots(len(records), len(heads), squeeze=False)
    for row, record in enumerate(records):
        final = samples.load_image(record.sample_id)
        draft = decode(record.draft) if decode else final
        raster_image = (raster.load_image(record.sample_id) if raster is not None and record.sample_id in raster_ids
                        else _blank(final.shape))
        changed = record.changed if record.changed is not None else np.zeros_like(record.redrawn)
        images = [raster_image, draft, tinted(draft, record.rejected, TINT["rejected"]),
                  tinted(draft, record.redrawn, TINT["redrawn"]), final, tinted(final, changed, TINT["changed"])]
        for col, image in enumerate(images):
            axis = axes[row, col]
            axis.imshow(image, interpolation="nearest")
            axis.set_xticks([])
            axis.set_yticks([])
            if row == 0:
                axis.set_title(heads[col], fontsize=8)
        axes[row, 0].set_ylabel(textwrap.fill(textwrap.shorten(str(texts.get(record.sample_id, "")), 60), 22),
                                fontsize=6)
        axes[row, 3].set_xlabel(_region_caption(record), fontsize=6)
    figure.suptitle(title, fontsize=9)
    return save(figure, stem)


def _region_caption(record: Redraw) -> str:
    cells = record.redrawn.size
    t0 = "none" if record.first_rejection >= cells else str(record.first_rejection)
    return f"t0 {t0}, {int(record.rejected.sum())} rej., {int(record.redrawn.sum())} redrawn"


def tau_curves(curves: Sequence[tuple[str, TauCurve]], title: str, stem: Path) -> list[Path]:
    """Rejected and redrawn shares (left) and target forwards (right) against tau, one line per set."""
    curves = list(curves)
    if not curves:
        raise ValueError("no tau curves to plot")
    figure = Figure(figsize=(9.0, 3.4), layout="constrained")
    share, forwards = figure.subplots(1, 2)
    for index, (label, curve) in enumerate(curves):
        color = f"C{index % 10}"
        share.plot(curve.tau, curve.rejected, "o-", color=color, ms=3, label=f"{label}: rejected")
        share.plot(curve.tau, curve.redrawn, "s--", color=color, ms=3, label=f"{label}: redrawn")
        forwards.plot(curve.tau, curve.target_forwards, "o-", color=color, ms=3, label=f"{label} ({curve.images} images)")
    for axis in (share, forwards):
        axis.set_xscale("symlog", linthresh=1e-8)
        axis.set_xlabel("τ (pooled-threshold rule)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=6)
    share.set_ylabel("share of the image")
    forwards.set_ylabel("target forwards per image")
    figure.suptitle(f"{title}: one verification pass, every τ", fontsize=9)
    return save(figure, stem)




SHAPES_WORLDS = {"shapes": "x1", "shapes_x2": "x2"}


def draft_decoder(model: str) -> Decode | None:
    """The shipped tokenizer's decode for a shapes world (model shapes or shapes_x2); None for
    other models, whose tokenizer the report does not load."""
    world = SHAPES_WORLDS.get(model)
    if world is None:
        return None
    import torch

    from harness.shapes.vq import load_tokenizer
    from harness.shapes.weights import WORLDS, verified

    tokenizer = load_tokenizer(verified("tokenizer.safetensors", WORLDS[world]))

    def decode(tokens: np.ndarray) -> np.ndarray:
        image = tokenizer.decode(torch.as_tensor(tokens, dtype=torch.long)[None])[0]
        return image.permute(1, 2, 0).numpy()

    return decode


def missing_rates(samples: SampleSet, decode: Decode, raster: SampleSet | None = None) -> dict[str, float]:
    """The shapes detector's missing-object rate (harness/shapes/missing.py) of the final images,
    the up-sampled drafts and, where given, the raster images of the same samples."""
    import json

    from harness.shapes.missing import missing_rate

    records = {r.sample_id: r for r in redraws(samples)}
    frame = samples.records()
    frame = frame[frame["sample_id"].isin(records)]
    metas = [json.loads(m) for m in frame["meta"]]
    ids = list(frame["sample_id"])
    out = {"final": missing_rate([samples.load_image(i) for i in ids], metas),
           "draft": missing_rate([decode(records[i].draft) for i in ids], metas)}
    if raster is not None:
        have = set(raster.records()["sample_id"])
        both = [(i, m) for i, m in zip(ids, metas) if i in have]
        if both:
            out["raster"] = missing_rate([raster.load_image(i) for i, _ in both], [m for _, m in both])
    return out


def mulo_figures(panels: Sequence[Panel], model: str, model_label: str, experiment: str, folder: Path,
                 raster: SampleSet | None = None, count: int = 6) -> list[tuple[str, Path]]:
    """For the panels with redraw records (MuLo-SD rows): one redraw-panel figure each, captioned
    with its region figures (and, on the shapes worlds, the missing-object rates of raster, draft
    and final), and one tau-curve figure of those that record it; (caption, PNG path) pairs."""
    written: list[tuple[str, Path]] = []
    curves: list[tuple[str, TauCurve]] = []
    decode: Decode | None = None
    loaded = False
    for index, panel in enumerate(panels):
        try:
            figures = region_figures(redraws(panel.samples))
        except ValueError:
            continue
        if not loaded:
            decode, loaded = draft_decoder(model), True
        caption = (f"Where MuLo-SD redraws, {panel.label}, {model_label} (first {count} images): per image "
                   f"{figures['share_redrawn']:.1%} of the cells redrawn in {figures['regions']:.2f} regions "
                   f"with {figures['seam_length']:.1f} cell edges of seam (means over {figures['images']:.0f} images)")
        if decode is not None:
            rates = missing_rates(panel.samples, decode, raster)
            caption += "; objects missing (shapes detector): " + ", ".join(
                f"{name} {rates[name]:.1%}" for name in ("raster", "draft", "final") if name in rates)
        paths = redraw_panels(panel.samples, f"{experiment}: {panel.label}, {model_label}",
                              folder / f"redraws_{model}_{index}", raster, decode, count)
        written.append((caption, next(p for p in paths if p.suffix == ".png")))
        try:
            curves.append((panel.label, tau_curve(panel.samples)))
        except ValueError:
            pass
    if curves:
        paths = tau_curves(curves, f"{experiment}: {model_label}", folder / f"tau_curve_{model}")
        written.append((f"Rejections vs τ from the verification pass, {model_label}",
                        next(p for p in paths if p.suffix == ".png")))
    return written


__all__ = ["draft_decoder", "missing_rates", "mulo_figures", "redraw_panels", "tau_curves", "tinted"]
