"""The calibration table: each backbone's raster row of experiment `calibration` beside the number its
own publication reports under the same protocol (harness/data/calibration_numbers.csv, each with its
source), the difference, the tolerance and whether the difference is within it (docs/calibration.md).

One line per (model, metric): a published number without a harness row shows the harness cell empty
(MISSING); a harness row of a model with no published number (LlamaGen-XL) shows its values with the
published cell empty and no verdict. Nothing is filled in.

Tolerances (TOLERANCES; the rule and its reason are printed under the table):

- GenEval, DPG-Bench: 2·√2·SE + r. SE is the harness row's standard error over images (summary.csv;
  GenEval's overall row has none, so SE = √(Σ_t p_t (1 − p_t) / n_t) / T over its T tag rows, the
  binomial error of the mean of per-tag accuracies);
  the published run drew its own images under the same protocol and count, and reports no error, so
  its error is taken equal to ours: √2·SE is the standard error of the difference of two independent
  runs and 2·√2·SE its two-sided 95% bound. r is half the last printed digit of the published number
  (GenEval is published as a fraction with two decimals: 0.5 points; DPG-Bench with two decimals:
  0.005). A row without a standard error is not judged.
- FID, CLIP score (SJD-PAC's COCO numbers): a fixed band, 2.0 FID and 1.0 CLIP. Neither has a
  per-image error that covers the whole number (FID is a statistic of the set; both depend on the
  implementation: SJD-PAC scores FID with pytorch-fid against a reference folder whose preprocessing its
  repository does not give, the harness with clean-fid at 256 px). SJD-PAC's own rows that sample the
  same distribution as AR (lossless SJD, SJD-PAC, EAGLE) differ from its AR row by up to 0.38 FID and
  0.42 CLIP on the same protocol, so run-to-run noise alone reaches about 0.4: the bands are about
  five and two and a half times that, to leave room for the implementation difference.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

from harness.report.paper_reference import load_paper_numbers
from harness.report.specs import MISSING

CALIBRATION_NUMBERS = Path(__file__).resolve().parents[1] / "data" / "calibration_numbers.csv"
EXPERIMENT = "calibration"
TABLE = "calibration"
TITLE = "Calibration: each backbone's raster row beside its own published number"
# real backbones of the experiment without a published number that could be read (docs/calibration.md)
UNPUBLISHED = ("LlamaGen-XL (llamagen_xl_512)",)


@dataclass(frozen=True, slots=True)
class Tolerance:
    """How far the harness's value may lie from the published one, and why.

    scale: harness unit -> published unit (GenEval fraction -> percent).
    band: the tolerance, from the harness row's standard error (published unit; None: not judged).
    rule: the rule as printed in the table's column.
    why: the justification printed under the table.
    """

    label: str
    scale: float
    decimals: int
    band: Callable[[float | None], float | None]
    rule: str
    why: str


def _noise_band(rounding: float) -> Callable[[float | None], float | None]:
    """2·√2·SE + rounding (None without a standard error)."""
    def band(stderr: float | None) -> float | None:
        return None if stderr is None else 2 * math.sqrt(2) * stderr + rounding
    return band


def _fixed(width: float) -> Callable[[float | None], float | None]:
    return lambda stderr: width


_NOISE_WHY = ("two independent runs of the same protocol and image count: the published run's standard error "
              "is taken equal to the harness row's (the publication gives none), so 2·√2·SE bounds their "
              "difference at 95%; plus half the published number's last printed digit")
_FID_WHY = ("SJD-PAC's rows that sample AR's distribution (SJD, SJD-PAC, EAGLE) lie within 0.38 FID of its AR row "
            "on the same protocol; the band is about five times that, for the implementation (SJD-PAC: pytorch-fid "
            "on a reference folder its repository does not describe; the harness: clean-fid at 256 px)")
_CLIP_WHY = ("the same rows lie within 0.42 CLIP of the AR row; the band is about two and a half times that")
TOLERANCES: dict[str, Tolerance] = {
    "geneval": Tolerance("GenEval (%)", 100.0, 1, _noise_band(0.5), "2·√2·SE + 0.5", _NOISE_WHY),
    "dpg_bench": Tolerance("DPG-Bench", 1.0, 2, _noise_band(0.005), "2·√2·SE + 0.005", _NOISE_WHY),
    "fid": Tolerance("FID", 1.0, 2, _fixed(2.0), "± 2.0", _FID_WHY),
    "clip_score": Tolerance("CLIP score", 1.0, 2, _fixed(1.0), "± 1.0", _CLIP_WHY),
}


@dataclass(frozen=True, slots=True)
class Line:
    """One (model, metric): the published value and its source, the harness's value (published unit)
    with its run and setting, and the verdict."""

    model: str
    label: str
    metric: str
    published: float | None
    source: str | None
    harness: float | None
    stderr: float | None
    n: int | None
    run_dir: str | None
    setting: str | None

    @property
    def tolerance(self) -> Tolerance:
        return TOLERANCES[self.metric]

    @property
    def delta(self) -> float | None:
        return None if self.published is None or self.harness is None else self.harness - self.published

    @property
    def band(self) -> float | None:
        return None if self.harness is None else self.tolerance.band(self.stderr)

    @property
    def within(self) -> bool | None:
        """True / False where both values and a band exist; None otherwise. A row made otherwise than
        the published protocol (`setting`) is never within."""
        if self.delta is None or self.band is None:
            return None
        return abs(self.delta) <= self.band and not self.setting


def load_published(path: Path | str = CALIBRATION_NUMBERS) -> pd.DataFrame:
    """The published facts of the calibration table (harness.report.paper_reference's validation).

    Raises:
        ValueError: a fact of another table or of a metric without a tolerance.
    """
    facts = load_paper_numbers(path)
    wrong = facts[(facts["table"] != TABLE) | ~facts["metric"].isin(list(TOLERANCES))]
    if not wrong.empty:
        raise ValueError(f"{path}: every row needs table={TABLE} and a metric among {list(TOLERANCES)}; "
                         f"the row {wrong.iloc[0][['table', 'model', 'metric']].to_dict()} has not")
    return facts


def build(frame: pd.DataFrame, facts: pd.DataFrame) -> list[Line]:
    """The lines of the table from the merged results `frame` (summary.csv rows) and the facts: the
    published (model, metric) pairs in the facts' order, then the harness's raster metrics of models
    the facts do not cover. Of several runs of one (model, metric), the last run directory wins."""
    rows = frame[(frame.get("experiment") == EXPERIMENT) & (frame.get("decoder") == "raster")] \
        if {"experiment", "decoder"} <= set(frame.columns) else frame.iloc[:0]
    tags = rows[(rows["metric"] == "geneval") & (rows["subset"].astype(str) != "all")] if not rows.empty else rows
    rows = rows[rows["metric"].isin(list(TOLERANCES)) & (rows["subset"].astype(str) == "all")] \
        if not rows.empty else rows
    rows = rows.sort_values("run_dir", kind="stable") if not rows.empty else rows
    labels = dict(zip(facts["model"], facts["base"]))
    keys = list(dict.fromkeys(zip(facts["model"], facts["metric"])))
    keys += [k for k in dict.fromkeys(zip(rows["model"], rows["metric"])) if k not in keys] if not rows.empty else []
    lines = []
    for model, metric in keys:
        fact = facts[(facts["model"] == model) & (facts["metric"] == metric)]
        found = rows[(rows["model"] == model) & (rows["metric"] == metric)] if not rows.empty else rows
        last = found.iloc[-1] if not found.empty else None
        scale = TOLERANCES[metric].scale
        stderr = None if last is None else _number(last.get("stderr"), scale)
        if last is not None and stderr is None and metric == "geneval":
            stderr = _tag_stderr(tags[(tags["run_dir"] == last["run_dir"]) & (tags["model"] == model)], scale)
        lines.append(Line(
            model=model, label=labels.get(model, model), metric=metric,
            published=float(fact["value"].iloc[0]) if not fact.empty else None,
            source=str(fact["source"].iloc[0]) if not fact.empty else None,
            harness=None if last is None else _number(last["value"], scale),
            stderr=stderr,
            n=None if last is None or _number(last.get("n"), 1.0) is None else int(last["n"]),
            run_dir=None if last is None else str(last["run_dir"]),
            setting=None if last is None else _text(last.get("setting"))))
    return lines


def to_markdown(lines: list[Line]) -> str:
    """The table as a Markdown section (title, table, tolerance rules and the sources)."""
    headers = ["Model", "Metric", "Published", "Harness", "Δ", "Tolerance", "Within"]
    body = []
    for line, previous in zip(lines, (None, *lines[:-1])):
        tol = line.tolerance
        label = "" if previous is not None and previous.model == line.model else line.label
        harness = _fmt(line.harness, tol.decimals)
        if line.harness is not None and line.stderr is not None:
            harness += f" ± {line.stderr:.{tol.decimals}f}"
        if line.setting:
            harness += f" ({line.setting})"
        band = f"{tol.rule} = {line.band:.{tol.decimals}f}" if line.band is not None else tol.rule
        body.append([label, tol.label, _fmt(line.published, tol.decimals), harness,
                     MISSING if line.delta is None else f"{line.delta:+.{tol.decimals}f}", band,
                     {True: "yes", False: "NO", None: MISSING}[line.within]])
    widths = [max([len(h), *(len(r[i]) for r in body)]) for i, h in enumerate(headers)]
    text = ["### " + TITLE, "", "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |",
            "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    text += ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in body]
    text += ["", notes(lines)]
    return "\n".join(text) + "\n"


def notes(lines: list[Line]) -> str:
    """What the columns mean, each tolerance's reason, each published number's source."""
    out = ["Published: the backbone's own publication, under the protocol the harness row ran "
           "(docs/calibration.md); Harness: experiment calibration's raster row (± its standard error; a "
           "setting in parentheses is a run otherwise than the published protocol, never within); "
           f"Δ = harness − published; Within: |Δ| ≤ tolerance ({MISSING}: nothing to compare). A backbone "
           "outside its tolerance is not ready for speed-ups."]
    for metric in dict.fromkeys(line.metric for line in lines):
        tol = TOLERANCES[metric]
        out.append(f"Tolerance of {tol.label}, {tol.rule}: {tol.why}.")
    for line in lines:
        if line.source:
            out.append(f"Source of {line.label} {line.tolerance.label}: {line.source}.")
    unpublished = list(dict.fromkeys([*UNPUBLISHED, *(line.label for line in lines if line.published is None)]))
    out.append(f"No published number: {', '.join(unpublished)} (its row runs and is shown without a verdict; "
               "docs/calibration.md says what was read).")
    return "\n".join(out)


def to_csv(lines: list[Line]) -> str:
    """One row per line, full precision, with the source and the run directory."""
    records = [{"model": l.model, "metric": l.metric, "published": l.published, "harness": l.harness,
                "harness_stderr": l.stderr, "n": l.n, "delta": l.delta, "tolerance": l.band,
                "tolerance_rule": l.tolerance.rule, "within": l.within, "setting": l.setting,
                "run_dir": l.run_dir, "source": l.source} for l in lines]
    return pd.DataFrame(records).to_csv(index=False, lineterminator="\n")


def _tag_stderr(tags: pd.DataFrame, scale: float) -> float | None:
    """GenEval overall's standard error from its tag rows (accuracy p_t over n_t images):
    √(Σ_t p_t (1 − p_t) / n_t) / T, in the shown unit; None without tag rows."""
    if tags.empty:
        return None
    p, n = tags["value"].astype(float), tags["n"].astype(float)
    return math.sqrt(float((p * (1 - p) / n).sum())) / len(tags) * scale


def _number(value: object, scale: float) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number * scale


def _text(value: object) -> str | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return str(value) or None


def _fmt(value: float | None, decimals: int) -> str:
    return MISSING if value is None else f"{value:.{decimals}f}"


__all__ = ["CALIBRATION_NUMBERS", "EXPERIMENT", "TOLERANCES", "Line", "build", "load_published", "to_csv",
           "to_markdown"]
