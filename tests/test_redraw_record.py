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
from harness.store.packed import pack_tokens, unpack_tokens
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


def _brute_region(rejected: list[int], radius: int, grid: tuple[int, int]) -> tuple[int, set[int]]:
    """t0 and the redraw region from the rejected raster positions, by the definition (paper §6)."""
    rows, cols = grid
    n = rows * cols
    t0 = min(rejected, default=n)
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


@pytest.mark.parametrize("radius", [0, 3])
def test_recorded_t0_and_region_equal_a_recomputation_from_rejections_and_radius(
        shapes: ModelBundle, radius: int) -> None:
    decoder = _mulo(tau=0.1, radius=radius)
    out = decoder.generate(shapes, shapes.condition(PROMPTS), SEEDS)
    grid = tuple(shapes.target.grid)
    n = grid[0] * grid[1]
    some = 0
    for stat in out.stats:
        row = stat.as_row()
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
