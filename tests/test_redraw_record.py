"""MuLo-SD's redraw record (baselines/framework/redraw.py): t0, the redraw region and the draft per
image, and the one-pass tau curve, checked against a brute-force recomputation and re-decoding."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from baselines.framework.redraw import TAU_GRID
from baselines.framework.speculative import SpeculativeDecoder
from baselines.methods.local import LocalScope
from baselines.methods.lowres import LowResDraft
from baselines.methods.pooled import PooledThresholdRule
from baselines.methods.resampling import IslandResampler
from baselines.methods.upsamplers import PixelUpsampler
from harness.api import ModelBundle, SamplingParams, int_list
from harness.run import guided
from harness.shapes.bundle import load
from harness.api import Prompt
from harness.shapes.captions import parse
from harness.report.figures import Panel
from harness.report.redraw_figures import draft_decoder, mulo_figures
from harness.report.redraws import redraws, region_figures, seam_length, tau_curve
from harness.shapes.missing import missing_objects
from harness.store.packed import pack_tokens, unpack_tokens
from harness.store.samples import SampleSet, plan
from tests.single_thread import single_thread  # noqa: F401  (autouse)

SAMPLED = SamplingParams(temperature=1.0, top_k=None, top_p=1.0, cfg_scale=1.5)
PROMPTS = ["a photo of a red circle", "a photo of three triangles",
           "a photo of a red circle and a blue square", "a photo of a circle right of a square"]
SEEDS = [11, 12, 13, 14]


@pytest.fixture(scope="module")
def shapes() -> ModelBundle:
    return guided(load(small_drafter=False, eagle_head=False), SAMPLED)


def _mulo(tau: float, radius: int = 3, rows: int | None = None) -> SpeculativeDecoder:
    draft = LowResDraft(PixelUpsampler("bicubic"), rows=rows, schedule="zipar", window=2)
    return SpeculativeDecoder(SAMPLED, draft, PooledThresholdRule(k=16, tau=tau), LocalScope(radius),
                              IslandResampler("parallel", window=2))


def _brute_region(rejected: list[int], radius: int | str, grid: tuple[int, int]) -> tuple[int, set[int]]:
    """t0 and the redraw region from the rejected raster positions, by the definition (paper §6;
    radius "all": every position from t0 on)."""
    rows, cols = grid
    n = rows * cols
    t0 = min(rejected, default=n)
    if radius == "all":
        return t0, set(range(t0, n))
    region = {u for u in range(t0, n) for t in rejected
              if abs(u // cols - t // cols) <= radius and abs(u % cols - t % cols) <= radius}
    return t0, region


def test_packed_tokens_round_trip_and_refuse_garbage() -> None:
    tokens = np.array([0, 511, 16383, 2**31 - 1, 7], dtype=np.int64)
    assert np.array_equal(unpack_tokens(pack_tokens(tokens)), tokens)
    with pytest.raises(ValueError, match="must start with"):
        unpack_tokens("1 2 3")
    with pytest.raises(ValueError, match="corrupt"):
        unpack_tokens("zi4:!!!!")


@pytest.mark.parametrize("radius", [0, 3, "all"])
def test_recorded_t0_and_region_equal_a_recomputation_from_rejections_and_radius(
        shapes: ModelBundle, radius: int | str) -> None:
    decoder = _mulo(tau=0.1, radius=radius)
    out = decoder.generate(shapes, shapes.condition(PROMPTS), SEEDS)
    grid = tuple(shapes.target.grid)
    n = grid[0] * grid[1]
    some = 0
    for stat in out.stats:
        row = stat.as_row()
        assert len(int_list(row["rejection_map"])) == len(int_list(row["redraw_map"])) == n  # the whole grid
        rejected = [i for i, v in enumerate(int_list(row["rejection_map"])) if v]
        some += bool(rejected)
        t0, region = _brute_region(rejected, radius, grid)
        assert row["first_rejection"] == t0
        assert {i for i, v in enumerate(int_list(row["redraw_map"])) if v} == region
        assert sum(int_list(row["redraw_map"])) == stat.extra["resample_set"]
        changed = np.array(int_list(row["changed_map"]), dtype=bool)
        draft = unpack_tokens(row["draft_tokens"])
        assert np.array_equal(changed, draft != out.tokens[out.stats.index(stat)].numpy())
        assert not (changed & ~np.array(int_list(row["redraw_map"]), dtype=bool)).any()
    assert some, "no image rejected anything: the check would be empty"


def test_recorded_draft_is_the_image_at_tau_zero(shapes: ModelBundle) -> None:
    """At tau = 0 every draft is kept: the recorded draft is the final image, token for token, and
    the same seeds at tau = 0.1 record the same draft (it is made before the verification)."""
    cond = shapes.condition(PROMPTS)
    kept = _mulo(tau=0.0).generate(shapes, cond, SEEDS)
    verified = _mulo(tau=0.1).generate(shapes, cond, SEEDS)
    for b, (a, v) in enumerate(zip(kept.stats, verified.stats)):
        draft = unpack_tokens(a.as_row()["draft_tokens"])
        assert np.array_equal(draft, kept.tokens[b].numpy())
        assert np.array_equal(unpack_tokens(v.as_row()["draft_tokens"]), draft)
        assert a.as_row()["first_rejection"] == 256 and sum(int_list(a.as_row()["redraw_map"])) == 0


def test_one_pass_tau_curve_equals_re_decoded_runs(shapes: ModelBundle) -> None:
    """The curve recorded by one run at tau = 0.1 gives, at three other tau values, the rejections,
    t0, redrawn positions and target forwards that decoding again at that tau records."""
    cond = shapes.condition(PROMPTS)
    curve = [s.as_row() for s in _mulo(tau=0.1).generate(shapes, cond, SEEDS).stats]
    grid = [float(t) for t in curve[0]["tau_grid"].split()]
    assert tuple(grid) == TAU_GRID
    for tau in (1e-8, 0.01, 0.5):
        at = grid.index(tau)
        again = _mulo(tau=tau).generate(shapes, cond, SEEDS).stats
        for row, stat in zip(curve, again):
            assert int_list(row["tau_rejected"])[at] == int((stat.rejection_map > 0).sum())
            assert int_list(row["tau_first"])[at] == stat.as_row()["first_rejection"]
            assert int_list(row["tau_redrawn"])[at] == stat.extra["resample_set"]
            assert int_list(row["tau_target_forwards"])[at] == stat.target_forwards
    rejected = np.array([int_list(row["tau_rejected"]) for row in curve])
    assert (np.diff(rejected, axis=1) >= 0).all() and rejected[:, 0].sum() == 0


def test_block_drafts_record_a_region_but_no_tau_curve(shapes: ModelBundle) -> None:
    """With rows = 1 the later blocks' p depends on earlier redraws: no one-pass curve is claimed."""
    out = _mulo(tau=0.1, radius=1, rows=1).generate(shapes, shapes.condition(PROMPTS[:2]), SEEDS[:2])
    for stat in out.stats:
        row = stat.as_row()
        assert "tau_rejected" not in row
        rejected = [i for i, v in enumerate(int_list(row["rejection_map"])) if v]
        assert row["first_rejection"] == min(rejected, default=256)
        assert len(unpack_tokens(row["draft_tokens"])) == 256


def _store(root, models: ModelBundle, tokens, stats, prompts) -> SampleSet:  # type: ignore[no-untyped-def]
    samples = SampleSet(root)
    images = models.target.decode(tokens).permute(0, 2, 3, 1).numpy()
    for spec, image, stat in zip(plan([Prompt(id=f"p{i}", text=t, meta=parse(t)) for i, t in enumerate(prompts)], 1, 0), images, stats):
        samples.write(spec, image, stat.as_row())
    return samples


def test_report_reads_the_records_and_draws_panels_and_the_tau_curve(shapes: ModelBundle, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cond = shapes.condition(PROMPTS)
    out = _mulo(tau=0.1).generate(shapes, cond, SEEDS)
    raster = _mulo(tau=0.0).generate(shapes, cond, SEEDS)  # any set of the same samples (raster is slow here)
    samples = _store(tmp_path / "mulo", shapes, out.tokens, out.stats, PROMPTS)
    raster_set = _store(tmp_path / "raster", shapes, raster.tokens, raster.stats, PROMPTS)
    records = redraws(samples)
    assert [r.first_rejection for r in records] == [s.as_row()["first_rejection"] for s in out.stats]
    figures = region_figures(records)
    shares = [s.extra["resample_set"] / 256 for s in out.stats]
    assert figures["share_redrawn"] == pytest.approx(np.mean(shares))
    curve = tau_curve(samples)
    assert curve.rejected[0] == 0 and curve.redrawn[-1] > curve.redrawn[1] > 0
    decode = draft_decoder("shapes")
    assert decode is not None and draft_decoder("llamagen_xl_512") is None
    assert np.array_equal(decode(records[0].draft), shapes.target.decode(torch.as_tensor(records[0].draft)
                                                                         .reshape(1, -1)).permute(0, 2, 3, 1)[0].numpy())
    written = mulo_figures([Panel("MuLo-SD", samples)], "shapes", "shapes", "test", tmp_path, raster_set, count=3)
    assert [p.name for _, p in written] == ["redraws_shapes_0.png", "tau_curve_shapes.png"]
    assert "objects missing (shapes detector): raster" in written[0][0]
    from benchmarks.mulo_redraws import main  # the same figures from a run's folders

    assert main(["--model", "shapes", "--samples", str(tmp_path), "--rows", "mulo", "--raster", "raster",
                 "--panels", "2", "--out", str(tmp_path / "bench")]) == 0
    assert {p.name for p in (tmp_path / "bench").glob("*.png")} == {"redraws_shapes_mulo.png", "tau_curve_shapes.png"}


def test_seam_length_counts_cell_edges_between_region_and_rest() -> None:
    region = np.zeros((5, 5), dtype=bool)
    region[1:3, 1:4] = True  # a 2 x 3 block: perimeter 2 * (2 + 3) = 10 edges
    assert seam_length(region) == 10
    region[:, :] = True
    assert seam_length(region) == 0


def test_missing_objects_counts_shortfalls_per_clause() -> None:
    blank = np.full((64, 64, 3), 255, dtype=np.uint8)
    meta = {"include": [{"class": "circle", "count": 2}, {"class": "square", "count": 1, "color": "red"}]}
    assert missing_objects(blank, meta) == (3, 3)


def test_radius_all_redraws_every_position_after_the_first_rejection() -> None:
    accept = torch.ones(2, 15, dtype=torch.bool)
    accept[0, 6] = False  # raster position 7 of a 4 x 4 grid (block from position 1)
    res = LocalScope("all").resolve(accept, torch.tensor([15, 15]), (4, 4))
    assert res.first.tolist() == [6, 15]
    assert res.resample[0].nonzero().flatten().tolist() == list(range(7, 15))
    assert res.keep[0].tolist() == [True] * 6 + [False] * 9 and not res.resample[1].any()
    with pytest.raises(ValueError, match="or 'all'"):
        LocalScope("everything")


def test_ablation_local_runs_radius_zero_and_everything_after_t0() -> None:
    from tests.conftest import compose_cfg

    cfg = compose_cfg(["+experiment=ablation_local"])
    assert cfg.decoder.mulo_l0.scope.radius == 0 and cfg.decoder.mulo_after_t0.scope.radius == "all"
    paper = compose_cfg(["+experiment=paper_ablation_local"])
    assert paper.decoder.mulo_after_t0.scope.radius == "all"


def test_tau_curve_false_leaves_the_curve_out_and_keeps_the_record(shapes: ModelBundle) -> None:
    decoder = _mulo(tau=0.1)
    decoder.tau_curve = False
    row = decoder.generate(shapes, shapes.condition(PROMPTS[:1]), SEEDS[:1]).stats[0].as_row()
    assert "tau_grid" not in row and "first_rejection" in row and "redraw_map" in row
