"""The matched-quality comparison as the paper makes it (paper.md §5): the paper does not give
MuLo-SD's tau; it sweeps tau and reports MuLo-SD at the operating point whose GenEval is closest to
LANTERN's, then compares speed. Experiments matched_quality and paper_matched_quality run one job
per tau, each with raster AR, LANTERN and MuLo-SD on the same prompts and image seeds; this module
reads their merged summary rows and adds the rows of the table "MuLo-SD at LANTERN's GenEval".

Per sweep point (one job):
  gap        MuLo-SD's GenEval minus LANTERN's on the same images, with its paired standard error
             (harness.store.summary.paired_difference on the job's per_sample verdicts). Where those
             files are gone: the difference of the two decoders' gaps to raster, with their paired
             standard errors combined as if independent (`paired` false: it ignores that both gaps
             share raster's images, so it is usually the larger of the two).
  speed-ups  over raster (the job's speedup_vs_raster row and its interval) and over LANTERN
             (harness.comparisons.speedup_interval on the two decoders' per_sample speed tables:
             the same timed images, bootstrapped in pairs).

Selection (`select`): the point with the smallest |gap|. Distances equal to within TIE go to the
point with the higher GenEval, then to the larger tau: a tie never goes to the side that flatters
MuLo-SD (lower quality, more drafts accepted). Points with |gap| <= their standard error are within
one SE of LANTERN's GenEval: when several are, the sweep cannot tell them apart at its number of
prompts and the row names them all; when none is, the row says that no tau reaches LANTERN's GenEval
within one SE.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from harness.api import SETTING_COLUMN
from harness.comparisons import speedup_interval
from harness.report.specs import MATCHED_DECODER, MATCHED_TABLE
from harness.store.summary import paired_difference

log = logging.getLogger(__name__)

SWEEPS = ("matched_quality", "paper_matched_quality")  # the experiments whose jobs are sweep points
TABLE = MATCHED_TABLE   # the experiment of the rows added here, and their table's name
MATCHED = MATCHED_DECODER  # the decoder key of the row "MuLo-SD at LANTERN's GenEval"
TAU = "decoder.mulo_sd.accept.tau"
NOT_VERIFIED = "up-sampled draft, not verified"  # the setting of MuLo-SD's rows at tau = 0
TIE = 1e-9                         # |gap| differences below this are ties (GenEval is a mean of 0/1)
GAP_METRIC = "geneval_gap_vs_lantern"
SPEEDUP_METRIC = "speedup_vs_lantern"
_SHOWN = ("geneval", "target_forwards", "timing_noise")  # copied from each job's rows as they are

Speedup = tuple[float, float, float, float]  # point, stderr, ci_low, ci_high (speedup_interval)


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One tau of a sweep: MuLo-SD's GenEval, its gap to LANTERN's, and its speed-ups."""

    tau: float
    geneval: float
    gap: float                 # MuLo-SD minus LANTERN, GenEval fraction
    stderr: float              # the gap's standard error (NaN: unknown)
    vs_raster: Speedup = (math.nan,) * 4
    vs_lantern: Speedup = (math.nan,) * 4
    paired: bool = True        # stderr from per-image verdicts paired on the same images
    run_dir: str = ""

    @property
    def within_se(self) -> bool:
        """|gap| <= stderr: LANTERN's GenEval lies within one standard error of this point's."""
        return abs(self.gap) <= self.stderr  # False for a NaN stderr


@dataclass(frozen=True, slots=True)
class Selection:
    """The chosen point and the points within one SE of LANTERN's GenEval (tau ascending)."""

    chosen: SweepPoint
    within_se: tuple[SweepPoint, ...]
    points: int

    @property
    def ambiguous(self) -> bool:
        """More than one tau is within one SE of LANTERN's GenEval."""
        return len(self.within_se) > 1

    def note(self) -> str:
        """What the row's label says about the choice, e.g. "τ=0.01, closest of 5; within one SE:
        τ=0, 0.003, 0.01"."""
        text = f"τ={self.chosen.tau:g}, closest of {self.points}"
        if not self.chosen.paired:
            text += ", gap SE unpaired"
        if self.ambiguous:
            return f"{text}; within one SE: τ={', '.join(f'{p.tau:g}' for p in self.within_se)}"
        if not self.within_se or not self.chosen.within_se:
            return f"{text}; no τ within one SE"
        return text


def select(points: Sequence[SweepPoint]) -> Selection:
    """The point whose GenEval is closest to LANTERN's (module docstring: ties, the SE flag).

    Raises:
        ValueError: no points.
    """
    if not points:
        raise ValueError("no sweep points to select from: run experiment matched_quality first")
    best = min(abs(p.gap) for p in points)
    tied = [p for p in points if abs(p.gap) - best <= TIE]
    highest = max(p.gap for p in tied)  # the higher GenEval (equal within TIE), then the stricter tau
    chosen = max((p for p in tied if highest - p.gap <= TIE), key=lambda p: p.tau)
    within = tuple(sorted((p for p in points if p.within_se), key=lambda p: p.tau))
    return Selection(chosen=chosen, within_se=within, points=len(points))


def sweep_points(frame: pd.DataFrame, experiment: str, model: str) -> list[SweepPoint]:
    """The sweep points of `experiment` on `model` in the merged summary `frame`
    (harness.store.summary.load), one per tau, the newest run where a tau ran twice. A job without
    a LANTERN or MuLo-SD GenEval row is left out, with a warning."""
    rows = frame[(frame["experiment"] == experiment) & (frame["model"] == model) & (frame["subset"] == "all")]
    if TAU not in rows.columns:
        return []
    found: dict[float, SweepPoint] = {}
    for run_dir in sorted(rows["run_dir"].astype(str).unique()):  # timestamped: the newest last
        point = _point(rows[rows["run_dir"].astype(str) == run_dir], run_dir)
        if point is not None:
            found[point.tau] = point
    return [found[tau] for tau in sorted(found)]


def _point(job: pd.DataFrame, run_dir: str) -> SweepPoint | None:
    """The sweep point of one job's rows, or None where it lacks LANTERN's or MuLo-SD's GenEval."""
    mine, lantern = _one(job, "mulo_sd", "geneval"), _one(job, "lantern", "geneval")
    if mine is None or lantern is None or pd.isna(mine.get(TAU)):
        log.warning("%s: no GenEval of both mulo_sd and lantern (with %s); not a matched-quality sweep "
                    "point", run_dir, TAU)
        return None
    gap, stderr, paired = _gap(job, run_dir, mine, lantern)
    return SweepPoint(tau=float(mine[TAU]), geneval=float(mine["value"]), gap=gap, stderr=stderr,
                      vs_raster=_speedup_row(job), vs_lantern=_speedup_vs_lantern(job, run_dir),
                      paired=paired, run_dir=run_dir)


def _gap(job: pd.DataFrame, run_dir: str, mine: pd.Series, lantern: pd.Series) -> tuple[float, float, bool]:
    """(MuLo-SD minus LANTERN, its standard error, paired): paired on the per-image verdicts where the
    job's per_sample files are at hand, else from the two gaps to raster (module docstring)."""
    a = _per_sample(run_dir, "mulo_sd", str(mine["evaluator"]))
    b = _per_sample(run_dir, "lantern", str(lantern["evaluator"]))
    if a is not None and b is not None:
        gap, stderr = paired_difference(a, b)
        return gap, stderr, True
    gap = float(mine["value"]) - float(lantern["value"])
    errors = [_one(job, d, "geneval_gap_vs_raster") for d in ("mulo_sd", "lantern")]
    if any(e is None for e in errors):
        return gap, math.nan, False
    stderr = math.sqrt(sum(float(e["stderr"]) ** 2 for e in errors if e is not None))
    return gap, stderr, False


def _speedup_row(job: pd.DataFrame, decoder: str = "mulo_sd") -> Speedup:
    """The job's speedup_vs_raster of `decoder` with its stderr and interval (NaN where absent)."""
    row = _one(job, decoder, "speedup_vs_raster")
    if row is None:
        return (math.nan,) * 4
    value, stderr, low, high = (_float(row.get(c)) for c in ("value", "stderr", "ci_low", "ci_high"))
    return value, stderr, low, high


def _speedup_vs_lantern(job: pd.DataFrame, run_dir: str) -> Speedup:
    """LANTERN's latency over MuLo-SD's, with the paired bootstrap interval where the job's per_sample
    speed tables are at hand; else the ratio of the two latency rows, without an interval."""
    mine, lantern = _one(job, "mulo_sd", "latency_s"), _one(job, "lantern", "latency_s")
    if mine is None or lantern is None:
        return (math.nan,) * 4
    a = _per_sample(run_dir, "mulo_sd", str(mine["evaluator"]))
    b = _per_sample(run_dir, "lantern", str(lantern["evaluator"]))
    if a is not None and b is not None:
        return speedup_interval(a, b)
    return (float(lantern["value"]) / float(mine["value"]), math.nan, math.nan, math.nan)


def _per_sample(run_dir: str, decoder: str, evaluator: str) -> pd.DataFrame | None:
    """<run_dir>/per_sample/<decoder>/<evaluator>.csv (harness/run.py writes it), or None."""
    path = Path(run_dir) / "per_sample" / decoder / f"{evaluator}.csv"
    return pd.read_csv(path) if path.is_file() else None


def _one(job: pd.DataFrame, decoder: str, metric: str) -> pd.Series | None:
    """The job's row of `decoder` and `metric` (subset all), or None."""
    found = job[(job["decoder"] == decoder) & (job["metric"] == metric)]
    return None if found.empty else found.iloc[0]


def _float(value: Any) -> float:
    """A number, NaN for a missing value."""
    number = pd.to_numeric(value, errors="coerce")
    return math.nan if pd.isna(number) else float(number)


def matched_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of the table TABLE for every (sweep experiment, model) of `frame`: raster and LANTERN
    from the chosen point's job, MuLo-SD at every tau, and MuLo-SD at LANTERN's GenEval (decoder
    MATCHED, its note in the setting column) with GenEval, the gap to LANTERN (stderr: the paired
    SE), the speed-ups over raster and LANTERN (with intervals), target forwards and timing_noise."""
    if frame.empty or not {"experiment", "model", "run_dir"} <= set(frame.columns):
        return pd.DataFrame()
    out: list[dict[str, Any]] = []
    for experiment in SWEEPS:
        models = frame.loc[frame["experiment"] == experiment, "model"].dropna().unique()
        for model in models:
            points = sweep_points(frame, experiment, str(model))
            if points:
                out += _table_rows(frame, points, select(points))
    return pd.DataFrame(out)


def with_matched_quality(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` plus `matched_rows(frame)` (nothing added where no sweep ran)."""
    rows = matched_rows(frame)
    if rows.empty:
        return frame
    log.info("matched quality: %d rows of table %s", len(rows), TABLE)
    return pd.concat([frame, rows], ignore_index=True)


def _table_rows(frame: pd.DataFrame, points: list[SweepPoint], chosen: Selection) -> list[dict[str, Any]]:
    """The table's rows of one (experiment, model) sweep."""
    job = _job(frame, chosen.chosen.run_dir)
    rows = []
    for decoder in ("raster", "lantern"):
        rows += _copied(job, decoder, decoder)
        timed = _one(job, decoder, "speedup_vs_raster")
        if timed is not None:
            rows.append(_row(timed, "speedup_vs_raster", _speedup_row(job, decoder), decoder))
    for point in points:
        rows += _point_rows(frame, point, "mulo_sd", None)
    return rows + _point_rows(frame, chosen.chosen, MATCHED, chosen.note())


def _point_rows(frame: pd.DataFrame, point: SweepPoint, decoder: str,
                note: str | None) -> list[dict[str, Any]]:
    """MuLo-SD's rows at `point` under the decoder key `decoder` (at tau = 0 their setting says
    NOT_VERIFIED: every draft is kept, so the image is the up-sampled draft)."""
    if point.tau == 0:
        note = NOT_VERIFIED if note is None else f"{note}; {NOT_VERIFIED}"
    job = _job(frame, point.run_dir)
    rows = _copied(job, "mulo_sd", decoder, tau=point.tau, note=note)
    quality, speed = _one(job, "mulo_sd", "geneval"), _one(job, "mulo_sd", "latency_s")
    if quality is not None:
        gap = (point.gap, point.stderr, math.nan, math.nan)
        rows.append(_row(quality, GAP_METRIC, gap, decoder, point.tau, note))
    for metric, value in (("speedup_vs_raster", point.vs_raster), (SPEEDUP_METRIC, point.vs_lantern)):
        if speed is not None and not math.isnan(value[0]):
            rows.append(_row(speed, metric, value, decoder, point.tau, note))
    return rows


def _job(frame: pd.DataFrame, run_dir: str) -> pd.DataFrame:
    """The rows (subset all) of the job written to `run_dir`."""
    return frame[(frame["run_dir"].astype(str) == run_dir) & (frame["subset"] == "all")]


def _copied(job: pd.DataFrame, source: str, decoder: str, tau: float | None = None,
            note: str | None = None) -> list[dict[str, Any]]:
    """The job's _SHOWN rows of `source`, as rows of TABLE under `decoder`."""
    rows = []
    for metric in _SHOWN:
        row = _one(job, source, metric)
        if row is not None:
            value = (_float(row["value"]), _float(row["stderr"]), math.nan, math.nan)
            rows.append(_row(row, metric, value, decoder, tau, note))
    return rows


def _row(base: pd.Series, metric: str, value: Speedup, decoder: str, tau: float | None = None,
         note: str | None = None) -> dict[str, Any]:
    """One row of TABLE: the run columns of `base` (the job's row the value comes from), `metric`
    and `value` (value, stderr, ci_low, ci_high) under the decoder key `decoder`."""
    return {"experiment": TABLE, "model": base["model"], "decoder": decoder, "dataset": base.get("dataset"),
            "evaluator": base.get("evaluator"), "evaluator_version": base.get("evaluator_version"),
            SETTING_COLUMN: note if note is not None else base.get(SETTING_COLUMN), TAU: tau,
            "metric": metric, "subset": "all", "value": value[0], "stderr": value[1], "ci_low": value[2],
            "ci_high": value[3], "n": base.get("n"),
            "higher_is_better": metric not in ("target_forwards", "timing_noise"),
            "run_dir": str(base["run_dir"])}


__all__ = ["MATCHED", "NOT_VERIFIED", "SWEEPS", "TABLE", "Selection", "SweepPoint", "matched_rows", "select", "sweep_points",
           "with_matched_quality"]
