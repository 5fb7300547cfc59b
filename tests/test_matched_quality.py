"""The matched-quality comparison (paper.md §5; harness/report/matched.py): the selection of the swept tau
whose GenEval is closest to LANTERN's on a synthetic sweep with known GenEval values and errors (the
closest point, the tie rule, the one-SE flag), the row "MuLo-SD at LANTERN's GenEval" in the regenerated
tables, the experiment itself on a tiny model, and MuLo-SD's real-model defaults apart from the
shapes worlds' operating points."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from harness.report.matched import MATCHED, TABLE, TAU, SweepPoint, select, sweep_points, with_matched_quality
from harness.report.tables import regenerate
from harness.store.summary import load, write_summary
from tests.conftest import compose_cfg

TAGS = ["single"] * 10 + ["pair"] * 10
# LANTERN's verdicts: single 8 of 10 right (images 0-7), pair 5 of 10 (images 10-14): GenEval 0.65.
LANTERN = [1] * 8 + [0] * 2 + [1] * 5 + [0] * 5
# MuLo-SD's verdicts per tau as flips of LANTERN's: (image, verdict). Known gaps and paired SEs
# (per tag var(d, ddof=1) / 10, summed, square root, / 2 tags):
#   0     8 -> 1, 15 -> 1            gap +0.10, SE sqrt(0.1/10 + 0.1/10) / 2 = 0.0707  (not within)
#   0.01  8 -> 1, 0 -> 0             gap  0.00, SE sqrt((2/9)/10) / 2 = 0.0745         (within)
#   0.03  0 -> 0, 15 -> 1, 10 -> 0   gap -0.05, SE sqrt(0.1/10 + (2/9)/10) / 2 = 0.0898 (within)
#   0.1   0..4 -> 0                  gap -0.25, SE sqrt((2.5/9)/10) / 2 = 0.0833       (not within)
FLIPS = {0.0: {8: 1, 15: 1}, 0.01: {8: 1, 0: 0}, 0.03: {0: 0, 15: 1, 10: 0}, 0.1: {i: 0 for i in range(5)}}
GAPS = {0.0: 0.10, 0.01: 0.0, 0.03: -0.05, 0.1: -0.25}
SES = {0.0: math.sqrt(0.02) / 2, 0.01: math.sqrt(2 / 90) / 2, 0.03: math.sqrt(0.01 + 2 / 90) / 2,
       0.1: math.sqrt(2.5 / 90) / 2}
# Timed latencies of the four timed images: LANTERN takes exactly 2.5x MuLo-SD's on every image at
# tau 0.01, so the paired bootstrap's every draw gives 2.5 (an unpaired one would spread).
MULO_LATENCY = {0.0: [0.2, 0.4, 0.6, 0.8], 0.01: [0.4, 0.8, 1.2, 1.6], 0.03: [0.5, 0.9, 1.3, 1.7],
                0.1: [0.6, 1.0, 1.4, 1.8]}
LANTERN_LATENCY = [1.0, 2.0, 3.0, 4.0]
RASTER_LATENCY = [4.0, 8.0, 12.0, 16.0]


def _geneval(verdicts: list[int]) -> float:
    """GenEval overall of TAGS: the mean over the two tags of each tag's share right."""
    frame = pd.DataFrame({"tag": TAGS, "correct": verdicts})
    return float(frame.groupby("tag")["correct"].mean().mean())


def _write_job(run_dir: Path, tau: float, per_sample: bool = True) -> None:
    """One matched_quality job as `python -m harness` writes it: summary.csv with the comparisons'
    rows, and per_sample/<decoder>/{geneval_shapes,speed}.csv."""
    verdicts = {"raster": LANTERN, "lantern": LANTERN,
                "mulo_sd": [FLIPS[tau].get(i, v) for i, v in enumerate(LANTERN)]}
    latency = {"raster": RASTER_LATENCY, "lantern": LANTERN_LATENCY, "mulo_sd": MULO_LATENCY[tau]}
    setting = {"lantern": "k=32, δ=0.4, on_reject=pooled"}
    rows = []
    for decoder in ("raster", "lantern", "mulo_sd"):
        base = {"experiment": "matched_quality", "model": "shapes_x2", "decoder": decoder,
                "dataset": "shapes", "evaluator_version": "1", TAU: tau, "setting": setting.get(decoder),
                "subset": "all", "n": 20, "ci_low": math.nan, "ci_high": math.nan}
        median = float(pd.Series(latency[decoder]).median())
        speedup = float(pd.Series(RASTER_LATENCY).median()) / median
        rows += [
            {**base, "evaluator": "geneval_shapes", "metric": "geneval", "value": _geneval(verdicts[decoder]),
             "stderr": 0.1, "higher_is_better": True},
            {**base, "evaluator": "geneval_shapes", "metric": "geneval_gap_vs_raster",
             "value": _geneval(verdicts[decoder]) - _geneval(LANTERN), "stderr": 0.03,
             "higher_is_better": True},
            {**base, "evaluator": "speed", "metric": "latency_s", "value": median, "stderr": math.nan,
             "higher_is_better": False},
            {**base, "evaluator": "speed", "metric": "speedup_vs_raster", "value": speedup, "stderr": 0.1,
             "ci_low": speedup - 0.2, "ci_high": speedup + 0.2, "higher_is_better": True},
            {**base, "evaluator": "speed", "metric": "timing_noise", "value": 0.3, "stderr": math.nan,
             "higher_is_better": False},
            {**base, "evaluator": "speed", "metric": "target_forwards", "value": 100.0, "stderr": math.nan,
             "higher_is_better": False}]
        if per_sample:
            folder = run_dir / "per_sample" / decoder
            folder.mkdir(parents=True, exist_ok=True)
            ids = [f"p{i}" for i in range(20)]
            pd.DataFrame({"sample_id": ids, "tag": TAGS, "correct": verdicts[decoder]}).to_csv(
                folder / "geneval_shapes.csv", index=False)
            timed = [i < 4 for i in range(20)]
            pd.DataFrame({"sample_id": ids, "batch_id": [f"b{i}" for i in range(20)], "timed": timed,
                          "latency_s": [latency[decoder][i] if i < 4 else math.nan for i in range(20)],
                          "latency_reps_s": [" ".join([str(latency[decoder][i])] * 2) if i < 4 else ""
                                             for i in range(20)]}).to_csv(folder / "speed.csv", index=False)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_summary(run_dir / "summary.csv", pd.DataFrame(rows))


def _sweep(root: Path, per_sample: bool = True) -> Path:
    """A four-point sweep under root/results/matched_quality/<time>/<job>."""
    sweep = root / "results" / "matched_quality" / "2026-01-01_00-00-00"
    for number, tau in enumerate(FLIPS):
        _write_job(sweep / str(number), tau, per_sample)
    return root / "results"


def _point(tau: float, gap: float, stderr: float = 0.01) -> SweepPoint:
    return SweepPoint(tau=tau, geneval=0.7 + gap, gap=gap, stderr=stderr)


# ----------------------------------------------------------------------------- the selection rule
def test_the_closest_point_is_chosen_whatever_its_sign() -> None:
    chosen = select([_point(0.0, 0.08), _point(0.01, -0.03), _point(0.1, -0.2)]).chosen
    assert chosen.tau == 0.01
    assert select([_point(0.0, 0.02), _point(0.01, -0.03)]).chosen.tau == 0.0
    with pytest.raises(ValueError, match="matched_quality"):
        select([])


def test_equal_distances_go_to_the_higher_geneval_then_the_larger_tau() -> None:
    # +0.02 and -0.02 are equally far: the point at or above LANTERN's GenEval, here the smaller tau
    assert select([_point(0.0, 0.02), _point(0.03, -0.02), _point(0.1, -0.3)]).chosen.tau == 0.0
    # the same gap twice (identical images, e.g. two tiny taus): the larger, stricter tau
    assert select([_point(0.001, -0.02), _point(0.003, -0.02), _point(0.3, 0.2)]).chosen.tau == 0.003
    # GenEval is a mean of 0/1 verdicts: 0.1 + 0.2 - 0.3 is a tie, not a hair's breadth win
    assert select([_point(0.0, 0.1 + 0.2 - 0.3), _point(0.01, 0.0)]).chosen.tau == 0.01


def test_the_label_names_every_tau_within_one_standard_error() -> None:
    several = select([_point(0.0, 0.03, 0.05), _point(0.01, -0.01, 0.04), _point(0.1, -0.2, 0.05)])
    assert several.chosen.tau == 0.01 and several.ambiguous
    assert [p.tau for p in several.within_se] == [0.0, 0.01]
    assert several.note() == "τ=0.01, closest of 3; within one SE: τ=0, 0.01"
    alone = select([_point(0.0, 0.03, 0.02), _point(0.01, -0.01, 0.04)])
    assert not alone.ambiguous and alone.note() == "τ=0.01, closest of 2"
    none = select([_point(0.0, 0.1, 0.02), _point(0.1, -0.3, 0.02)])
    assert none.within_se == () and none.note() == "τ=0, closest of 2; no τ within one SE"
    unknown = select([_point(0.0, 0.0, math.nan)])  # no error known: never within
    assert unknown.note() == "τ=0, closest of 1; no τ within one SE"


# ----------------------------------------------------------------------------- a synthetic sweep
def test_a_sweep_gives_each_tau_its_paired_gap_to_lantern_and_speedups(tmp_path: Path) -> None:
    results = _sweep(tmp_path)
    points = sweep_points(load([results]), "matched_quality", "shapes_x2")
    assert [p.tau for p in points] == [0.0, 0.01, 0.03, 0.1]
    for point in points:
        assert point.paired
        assert point.gap == pytest.approx(GAPS[point.tau], abs=1e-12)
        assert point.stderr == pytest.approx(SES[point.tau], rel=1e-9)
    at = {p.tau: p for p in points}
    assert at[0.01].vs_lantern == pytest.approx((2.5, 0.0, 2.5, 2.5))  # paired: every draw 2.5
    assert at[0.01].vs_raster[0] == pytest.approx(10.0)  # the job's speedup_vs_raster row
    chosen = select(points)
    assert chosen.chosen.tau == 0.01 and [p.tau for p in chosen.within_se] == [0.01, 0.03]


def test_the_tables_gain_the_row_mulo_sd_at_lanterns_geneval(tmp_path: Path) -> None:
    done = regenerate([_sweep(tmp_path)], tmp_path / "paper", figures=False, pages=False)
    table = next(t for t in done.tables if t.spec.name == TABLE)
    at = table.swept.index(TAU)
    rows = {(r.decoder, r.swept[at]): r for r in table.rows}
    matched = rows[(MATCHED, 0.01)]
    assert matched.method_label == \
        "MuLo-SD at LANTERN's GenEval (τ=0.01, closest of 4; within one SE: τ=0.01, 0.03)"
    assert matched.cells["speedup_vs_lantern"].ours == pytest.approx(2.5)
    assert (matched.cells["speedup_vs_lantern"].ci_low, matched.cells["speedup_vs_lantern"].ci_high) == \
        pytest.approx((2.5, 2.5))
    assert matched.cells["speedup"].ours == pytest.approx(10.0)
    assert matched.cells["geneval_gap_vs_lantern"].ours == pytest.approx(0.0, abs=1e-9)
    assert matched.cells["geneval_gap_vs_lantern"].stderr == pytest.approx(100 * SES[0.01])
    assert matched.cells["geneval"].ours == pytest.approx(65.0)
    assert matched.cells["timing_noise"].ours == pytest.approx(0.3)
    assert {d for d, _ in rows} == {"raster", "lantern", "mulo_sd", MATCHED}
    assert sorted(t for d, t in rows if d == "mulo_sd") == [0.0, 0.01, 0.03, 0.1]
    # nothing is verified at tau = 0: that row says what ran, the verified ones do not
    assert rows[("mulo_sd", 0.0)].method_label.endswith("(up-sampled draft, not verified)")
    assert "not verified" not in rows[("mulo_sd", 0.01)].method_label
    lantern = next(r for r in table.rows if r.decoder == "lantern")
    assert lantern.method_label == "LANTERN (k=32, δ=0.4, on_reject=pooled)"
    assert lantern.cells["speedup"].ours == pytest.approx(4.0)
    assert next(r for r in table.rows if r.decoder == "raster").cells["speedup"].ours == pytest.approx(1.0)
    markdown = (tmp_path / "paper" / "tables" / f"{TABLE}.md").read_text()
    assert "MuLo-SD at LANTERN's GenEval (τ=0.01" in markdown and "2.50× [2.50, 2.50]" in markdown
    assert "matched_quality" in [t.spec.name for t in done.tables]  # the raw sweep keeps its own table


def test_without_per_image_files_the_gap_error_is_unpaired_and_said_so(tmp_path: Path) -> None:
    points = sweep_points(load([_sweep(tmp_path, per_sample=False)]), "matched_quality", "shapes_x2")
    at = {p.tau: p for p in points}
    assert not at[0.01].paired
    assert at[0.01].stderr == pytest.approx(math.sqrt(0.03 ** 2 + 0.03 ** 2))  # the two gaps to raster
    assert at[0.01].vs_lantern[0] == pytest.approx(2.5) and math.isnan(at[0.01].vs_lantern[2])
    assert "gap SE unpaired" in select(points).note()


def test_no_sweep_adds_no_rows(tmp_path: Path) -> None:
    run = tmp_path / "results" / "main" / "t"
    _write_job(run, 0.0, per_sample=False)
    frame = load([tmp_path / "results"])
    frame["experiment"] = "main"
    assert with_matched_quality(frame) is frame


# ----------------------------------------------------------------------------- the experiment
TINY = ["model=random", "model.grid=4", "model.dim=16", "model.vocab=16", "model.n_layer=1",
        "evaluator=[speed,geneval_shapes]", "dataset_limit=2", "batch_size=1", "warmup_batches=0",
        "threads=1"]


def test_the_experiment_runs_and_its_jobs_feed_the_row(tmp_path: Path) -> None:
    from harness.run import run

    sweep = tmp_path / "results" / "matched_quality" / "t"
    for number, tau in enumerate((0.0, 1.0)):
        cfg = compose_cfg(["+experiment=matched_quality", *TINY, f"{TAU}={tau}"])
        assert list(cfg.decoder) == ["raster", "lantern", "mulo_sd"] and list(cfg.swept_keys) == [TAU]
        cfg.report = False
        run(cfg, sweep / str(number))
    points = sweep_points(load([tmp_path / "results"]), "matched_quality", "random")
    assert [p.tau for p in points] == [0.0, 1.0] and all(p.paired for p in points)
    assert all(not math.isnan(p.vs_lantern[0]) for p in points)
    done = regenerate([tmp_path / "results"], tmp_path / "paper", figures=False, pages=False)
    table = next(t for t in done.tables if t.spec.name == TABLE)
    assert any(r.decoder == MATCHED and r.method_label.startswith("MuLo-SD at LANTERN's GenEval (τ=")
               for r in table.rows)


def test_the_paper_experiment_sweeps_a_real_model_against_the_papers_lantern() -> None:
    cfg = compose_cfg(["+experiment=paper_matched_quality", "model=llamagen_xl_512"])
    assert list(cfg.decoder) == ["raster", "lantern", "mulo_sd"] and cfg.protocol_name == "geneval"
    assert (cfg.decoder.lantern.accept.k, cfg.decoder.lantern.accept.delta) == (1000, 0.4)
    assert cfg.require_cuda is True and list(cfg.swept_keys) == [TAU]


# ----------------------------------------------------------------------------- MuLo-SD's defaults
def _mulo(overrides: list[str], decoder: str = "mulo_sd") -> tuple:
    node = compose_cfg(overrides).decoder[decoder]
    up = node.draft.upsampler
    return node.draft.window, node.accept.k, node.accept.tau, up.kind, up.mode


@pytest.mark.parametrize("model", ["llamagen_xl_512", "tar_1.5b_512", "tar_7b_1024"])
def test_real_models_take_the_real_model_defaults(model: str) -> None:
    assert _mulo([f"model={model}"]) == (8, 1000, 0.1, "sr", "bicubic")  # the Real-ESRGAN network of r
    assert _mulo([f"model={model}", "decoder=[mulo_sd_bicubic]"], "mulo_sd_bicubic") == (8, 1000, 0.1, "pixel", "bicubic")


def test_the_tiny_stand_ins_keep_the_bicubic_resize() -> None:
    assert _mulo(["model=tar_tiny"]) == (8, 1000, 0.1, "pixel", "bicubic")  # tests stay offline


def test_the_shapes_worlds_keep_their_operating_points() -> None:
    assert _mulo(["model=shapes"]) == (2, 16, 0.1, "pixel", "bicubic")
    assert _mulo(["model=shapes_x2"]) == (8, 16, 0.1, "pixel", "bicubic")
    assert _mulo(["model=random"]) == (2, 16, 0.1, "pixel", "bicubic")
    assert _mulo(["model=shapes", "~model.operating_points"]) == (8, 1000, 0.1, "sr", "bicubic")
    assert _mulo(["model=shapes", "decoder.mulo_sd.accept.k=4"])[1] == 4  # the key itself wins
    anchored = compose_cfg(["model=shapes_x2", "decoder=[mulo_sd_anchored]"]).decoder.mulo_sd_anchored
    assert (anchored.draft.window, anchored.accept.k, anchored.accept.anchor) == (8, 16, 4)
