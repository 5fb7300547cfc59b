"""The goal of issue 5 read off a benchmark run: >= 4x fewer target forwards than raster, >= 3x
wall-clock speed-up and a shapes-GenEval gap of at least -0.02, each row's numbers taken from the
run's summary (target_forwards, speedup_vs_raster with its interval, geneval_gap_vs_raster with its
paired standard error, timing_noise). A row whose timing the run found unreliable decides nothing:
the verdict says so instead of "met" (issue 31).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import pandas as pd

GOAL = {"forwards": 4.0, "speedup": 3.0, "gap": -0.02}  # issue 5: vs raster, shapes-GenEval gap
HELD_OUT_SEED = 2  # global seed of the benchmarks' images: never used to choose weights or defaults
GOAL_IMAGES = 1536  # quality images below which a verdict's gap cannot resolve the goal's 2 points


def sample_note(images: int) -> str | None:
    """A warning to print under a verdict read off fewer than GOAL_IMAGES quality images."""
    if images >= GOAL_IMAGES:
        return None
    return (f"note: GenEval on {images} images cannot resolve the goal's 2-point gap (paired standard error "
            f"about 0.012 at {GOAL_IMAGES}); score with --quality-images {GOAL_IMAGES} or "
            "benchmarks/mulo_quality.py")


def rows_of(summary: pd.DataFrame, decoders: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """One dict per decoder (raster first when present) with the numbers the verdict reads."""
    def get(decoder: str, metric: str, column: str = "value") -> float:
        rows = summary[(summary.decoder == decoder) & (summary.metric == metric) & (summary.subset == "all")]
        return float(rows[column].iloc[0]) if len(rows) and column in rows else math.nan

    names = list(dict.fromkeys(decoders or summary["decoder"].astype(str)))
    names.sort(key=lambda d: d != "raster")
    return [{"decoder": d, "target": get(d, "target_forwards"), "speedup": get(d, "speedup_vs_raster"),
             "ci_low": get(d, "speedup_vs_raster", "ci_low"), "ci_high": get(d, "speedup_vs_raster", "ci_high"),
             "gap": get(d, "geneval_gap_vs_raster"), "gap_se": get(d, "geneval_gap_vs_raster", "stderr"),
             "noise": get(d, "timing_noise")} for d in names]


def _meets(row: dict[str, Any], raster: dict[str, Any], goal: dict[str, float]) -> tuple[bool, bool, bool]:
    """(forward reduction, wall-clock speed-up, GenEval gap) goals met by one row."""
    reduction = raster["target"] / row["target"] if row["target"] else float("inf")
    return reduction >= goal["forwards"], row["speedup"] >= goal["speedup"], row["gap"] >= goal["gap"]


def _describe(row: dict[str, Any]) -> str:
    interval = f" [{row['ci_low']:.2f}, {row['ci_high']:.2f}]" if not math.isnan(row.get("ci_low", math.nan)) else ""
    return f"{row['decoder']} ({row['speedup']:.2f}x{interval}, gap {row['gap']:+.3f} +- {row['gap_se']:.3f})"


def goal_verdict(rows: Sequence[dict[str, Any]], goal: dict[str, float] = GOAL,
                 noise_threshold: float = 0.1) -> list[str]:
    """The goal read off timed rows with gaps (one of them raster): lines naming the rows that
    meet all of it, the fastest row within the gap, the best gap at the speed-up goal and the
    Pareto front (no other row is both faster and closer to raster). When a row's timing_noise
    exceeds `noise_threshold`, the first line says the goal is undecided and names the rows."""
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
    noisy = [r for r in rows if r.get("noise", 0.0) > noise_threshold]
    if noisy:
        first = (f"{head}: undecided, timing unreliable for "
                 + ", ".join(f"{r['decoder']} (timing_noise {r['noise']:.2f})" for r in noisy)
                 + f" > {noise_threshold:g}; rerun on a quiet machine")
    else:
        first = f"{head}: " + ("met by " + ", ".join(_describe(r) for r in met) if met else "not met by any row")
    return [
        first,
        "fastest within the gap: " + (_describe(max(within, key=lambda r: r["speedup"])) if within else "none"),
        f"best gap at >= {goal['speedup']:g}x: " + (_describe(max(fast, key=lambda r: r["gap"])) if fast else "none"),
        "Pareto front (speed-up vs gap): " + ", ".join(_describe(r) for r in
                                                      sorted(front, key=lambda r: -r["speedup"])),
    ]
