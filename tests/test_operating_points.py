"""Operating points: each world runs a decoder at its method's intent (LANTERN k 32, δ 0.4, pooled on
the shapes worlds), the paper's setting is one override away and pinned by the paper experiments, the
SampleSet binding records the setting used, and rows run otherwise than in the paper are labelled."""
from __future__ import annotations

import pandas as pd
import pytest
import torch

from harness.store import summary as results
from harness.store.binding import without_defaults
from harness.report.build import build_table
from harness.report.paper_reference import load_paper_numbers
from harness.report.render import key_headers, to_markdown
from harness.report.specs import generic_spec
from harness.comparisons import decoder_setting
from harness.run import _build
from harness.store.binding import sample_binding
from harness.store.samples import binding_differences
from tests.conftest import compose_cfg

SHAPES_POINT = {"k": 32, "delta": 0.4, "on_reject": "pooled"}
PAPER = {"k": 1000, "delta": 0.4, "on_reject": "neighbourhood"}
CPU = torch.device("cpu")


def _accept(overrides: list[str]) -> dict:
    cfg = compose_cfg(overrides)
    return {key: cfg.decoder.lantern.accept[key] for key in PAPER}


@pytest.mark.parametrize("model", ["shapes", "shapes_x2"])
def test_default_job_runs_lantern_at_the_worlds_operating_point(model: str) -> None:
    cfg = compose_cfg([f"model={model}"])
    assert _accept([f"model={model}"]) == SHAPES_POINT
    rule = _build(cfg.decoder.lantern).accept  # paper_setting is not passed to the decoder
    assert (rule.k, rule.delta, rule.on_reject) == (32, 0.4, "pooled")
    assert decoder_setting(cfg, "lantern") == "k=32, δ=0.4, on_reject=pooled"
    assert decoder_setting(cfg, "raster") is None and decoder_setting(cfg, "eagle2") is None


@pytest.mark.parametrize("overrides", [
    ["~model.operating_points"],                       # the paper's setting, one override away
    ["+experiment=paper_main"],                        # the paper experiment on a real model
    ["+experiment=paper_main", "model=shapes"],        # pinned even on a world that declares a point
    ["model=random"],                                  # a model without operating points
])
def test_paper_setting_is_one_override_away_and_pinned_by_the_paper_experiment(overrides: list[str]) -> None:
    assert _accept(overrides) == PAPER
    assert decoder_setting(compose_cfg(overrides), "lantern") is None


def test_an_override_of_the_key_itself_wins_and_is_labelled() -> None:
    cfg = compose_cfg(["decoder.lantern.accept.k=64"])
    assert _accept(["decoder.lantern.accept.k=64"]) == {**SHAPES_POINT, "k": 64}
    assert decoder_setting(cfg, "lantern") == "k=64, δ=0.4, on_reject=pooled"
    assert decoder_setting(compose_cfg(["decoder.zipar.window=16"]), "zipar") is None  # ZipAR-16: the paper's
    assert decoder_setting(compose_cfg([]), "zipar") == "window=8"


def test_the_binding_records_the_setting_and_leaves_the_model_alone() -> None:
    world, paper = compose_cfg([]), compose_cfg(["~model.operating_points"])
    bound = sample_binding(world, "lantern", "w", CPU)
    assert {key: bound["decoder"]["accept"][key] for key in PAPER} == SHAPES_POINT
    assert "paper_setting" not in bound["decoder"] and "operating_points" not in bound["model"]
    # a set made at the paper's setting is refused under the world's, naming the keys ...
    diffs = binding_differences(sample_binding(paper, "lantern", "w", CPU), bound, without_defaults)
    assert any("accept" in d and "k" in d for d in diffs) and any("on_reject" in d for d in diffs)
    # ... while raster's binding (and so every stored raster set) is the same under both
    assert sample_binding(world, "raster", "w", CPU) == sample_binding(paper, "raster", "w", CPU)


def test_the_setting_label_follows_the_images_scored() -> None:
    """An evaluate-only run labels rows with the setting of the stored images (their binding), and a
    binding from before an option existed reads that option's default."""
    cfg = compose_cfg([])  # this job: the shapes operating point
    stored = sample_binding(compose_cfg(["~model.operating_points"]), "lantern", "w", CPU)
    assert decoder_setting(cfg, "lantern", stored) is None  # the images are the paper's
    del stored["decoder"]["accept"]["on_reject"]  # made before on_reject existed: LANTERN's own
    assert decoder_setting(cfg, "lantern", stored) is None
    stored["decoder"]["accept"]["k"] = 16
    assert decoder_setting(cfg, "lantern", stored) == "k=16, δ=0.4, on_reject=neighbourhood"


def _summary() -> pd.DataFrame:
    rows = []
    for decoder, setting, geneval in (("raster", None, 0.76), ("lantern", "k=32, δ=0.4, on_reject=pooled", 0.77)):
        for metric, value in (("geneval", geneval), ("speedup_vs_raster", 1.0 if decoder == "raster" else 0.8)):
            rows.append({"experiment": "default", "model": "shapes", "decoder": decoder, "dataset": "shapes",
                         "evaluator": "speed", "evaluator_version": "1", "engine": "eager", "setting": setting,
                         "metric": metric, "subset": "all", "value": value, "stderr": 0.01, "n": 64,
                         "higher_is_better": True, "run_dir": "r"})
    return pd.DataFrame(rows)


def test_tables_state_the_setting_of_rows_run_otherwise() -> None:
    frame = _summary()
    printed = results.headline(frame)
    assert "| lantern (k=32, δ=0.4, on_reject=pooled) |" in printed and "| raster " in printed
    assert "another setting than the paper's" in printed
    table = build_table(frame, generic_spec("default"), load_paper_numbers(), paper_rows=False)
    labels = {row.decoder: row.method_label for row in table.rows}
    assert labels == {"raster": "Raster AR", "lantern": "LANTERN (k=32, δ=0.4, on_reject=pooled)"}
    assert "setting" not in key_headers(table)  # in the label, not a column of its own
    assert "LANTERN (k=32, δ=0.4, on_reject=pooled)" in to_markdown(table)
    plain = results.headline(frame.drop(columns="setting"))
    assert "(k=32" not in plain and "another setting" not in plain
