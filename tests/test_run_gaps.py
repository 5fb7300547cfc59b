"""harness.run adds each decoder's GenEval gap to raster, paired by image, to the job's summary."""
from __future__ import annotations

import pandas as pd
import pytest

from evaluators.geneval_rules import paired_difference
from harness.api import metric_rows
from harness.comparisons import _with_geneval_gap


def _summary(scores: dict[str, float], evaluator: str = "geneval_shapes") -> pd.DataFrame:
    frame = metric_rows([{"metric": "geneval", "subset": "all", "value": v, "n": 4} for v in scores.values()])
    frame.insert(0, "decoder", list(scores))
    frame.insert(1, "evaluator", evaluator)
    return frame


def _verdicts(correct: list[int]) -> pd.DataFrame:
    return pd.DataFrame({"sample_id": ["a", "b", "c", "d"],
                         "tag": ["colors", "colors", "position", "position"],
                         "correct": [bool(c) for c in correct]})


def test_gaps_are_paired_differences_to_raster() -> None:
    verdicts = {("raster", "geneval_shapes"): _verdicts([1, 1, 0, 1]),
                ("mulo_sd", "geneval_shapes"): _verdicts([1, 0, 0, 0])}
    summary = _summary({"raster": 0.75, "mulo_sd": 0.25})
    out = _with_geneval_gap(summary, verdicts)
    gaps = out[out.metric == "geneval_gap_vs_raster"].set_index("decoder")
    assert gaps.loc["raster", "value"] == 0.0 and gaps.loc["raster", "stderr"] == 0.0
    expected = paired_difference(verdicts[("mulo_sd", "geneval_shapes")], verdicts[("raster", "geneval_shapes")])
    assert (gaps.loc["mulo_sd", "value"], gaps.loc["mulo_sd", "stderr"]) == pytest.approx(expected)
    assert gaps.loc["mulo_sd", "value"] == pytest.approx(-0.5)
    assert list(out.columns) == list(summary.columns) and len(out) == 4


def test_no_gap_without_raster_or_per_image_verdicts() -> None:
    summary = _summary({"sjd": 0.5, "mulo_sd": 0.25})
    verdicts = {("sjd", "geneval_shapes"): _verdicts([1, 0, 1, 0]),
                ("mulo_sd", "geneval_shapes"): _verdicts([1, 0, 0, 0])}
    assert _with_geneval_gap(summary, verdicts).equals(summary)
    with_raster = _summary({"raster": 0.5, "sjd": 0.5})
    assert _with_geneval_gap(with_raster, {}).equals(with_raster)
