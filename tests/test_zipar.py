"""ZipAR parallel decoding: its schedule, equality with raster decoding at window = cols, masks."""
from __future__ import annotations

import pytest
import torch

from baselines.methods.raster import RasterDecoder
from baselines.methods.zipar import ZipARDecoder, zipar_schedule
from harness.api import SamplingParams
from harness.models.random.bundle import build
from harness.run import guided
from tests.single_thread import single_thread  # noqa: F401  (autouse)

PARAMS = SamplingParams(temperature=1.0, top_k=20, top_p=0.9, cfg_scale=2.0)
PROMPTS = ["a red circle", "a blue square", "two green triangles", "a star"]


@pytest.mark.parametrize("rows,cols,window", [(4, 4, 1), (4, 4, 2), (3, 5, 2), (4, 4, 4), (2, 6, 3)])
def test_schedule_decodes_every_position_once_in_zipar_order(rows: int, cols: int, window: int) -> None:
    steps = zipar_schedule(rows, cols, window)
    assert len(steps) + 1 == (rows - 1) * window + cols, "forwards including the prefill"
    decoded_at = {0: 0}
    for t, step in enumerate(steps, start=1):
        for pos in step.decoded.tolist():
            assert pos not in decoded_at
            decoded_at[pos] = t
    assert sorted(decoded_at) == list(range(rows * cols))
    for (r, c), t in (((p // cols, p % cols), t) for p, t in decoded_at.items()):
        assert t == r * window + c, "row r starts once row r-1 holds `window` tokens"
    # each decoded position is predicted by the input at the slot before it; its own token is fed
    # at its slot in a later forward (except the last position), replacing any stand-in
    fed_real = {}
    for t, step in enumerate(steps, start=1):
        slots, sources = step.slots.tolist(), step.sources.tolist()
        assert [slots[i] for i in step.from_input.tolist()] == [p - 1 for p in step.decoded.tolist()]
        for slot, src in zip(slots, sources):
            assert decoded_at[src] < t, "only decoded tokens are fed"
            if slot == src:
                fed_real[slot] = t
            else:
                assert window < cols and slot % cols == cols - 1, "stand-ins only at row ends"
                assert slot not in fed_real, "a stand-in never overwrites the real token"
    assert sorted(fed_real) == list(range(rows * cols - 1))


@pytest.mark.parametrize("stand_in,back", [("reference", 2), ("above", 1)])
def test_stand_ins_are_the_newest_token_of_the_chosen_row(stand_in: str, back: int) -> None:
    """Row r's first token is predicted from slot (r-1, cols-1) before that is decoded; the token
    fed there is the newest decoded token of row r-back (row 0 for r = 1)."""
    rows, cols, window = 5, 6, 2
    steps = zipar_schedule(rows, cols, window, stand_in)
    seen = 0
    for t, step in enumerate(steps, start=1):
        for slot, src in zip(step.slots.tolist(), step.sources.tolist()):
            if slot == src:
                continue
            r = slot // cols + 1  # the row whose first token this slot predicts
            row = max(r - back, 0)
            assert src == row * cols + min(t - 1 - row * window, cols - 1), (t, slot, src)
            seen += 1
    assert seen == rows - 1, "one stand-in per row after the first"
    with pytest.raises(ValueError, match="reference"):
        ZipARDecoder(SamplingParams(), window=2, stand_in="left")


@pytest.mark.parametrize("mask", ["written", "causal"])
def test_window_equal_to_cols_is_raster_decoding(mask: str) -> None:
    bundle = build(grid=4, vocab=32, dim=32)
    models = guided(bundle, PARAMS)
    cond = models.condition(PROMPTS)
    raster = RasterDecoder(PARAMS).generate(models, cond, [3, 4, 5, 6])
    zipar = ZipARDecoder(PARAMS, window=4, mask=mask).generate(models, cond, [3, 4, 5, 6])
    assert torch.equal(zipar.tokens, raster.tokens)
    assert [s.target_forwards for s in zipar.stats] == [16] * 4
    assert zipar.stats[0].accepted_per_step == [1] * 16


class _Spy:
    """Wraps an ARImageModel and records (positions, mask) of every cached forward."""

    def __init__(self, model) -> None:
        self.model, self.calls = model, []
        self.grid, self.vocab_size = model.grid, model.vocab_size

    def __getattr__(self, name: str):
        return getattr(self.model, name)

    def forward(self, tokens, positions, mask=None):
        self.calls.append((positions.clone(), None if mask is None else mask.clone()))
        return self.model.forward(tokens, positions, mask)


def test_small_windows_take_fewer_forwards_and_attend_only_to_written_slots() -> None:
    bundle = build(grid=4, vocab=32, dim=32)
    spy = _Spy(bundle.target)
    bundle.target = spy
    cond = bundle.condition(PROMPTS)
    out = ZipARDecoder(PARAMS, window=2, mask="written").generate(bundle, cond, [3, 4, 5, 6])
    stats = out.stats[0]
    assert stats.target_forwards == 3 * 2 + 4 and sum(stats.accepted_per_step) == 16
    assert max(stats.accepted_per_step) == 2, "two rows advance together"
    prefix = spy.cache_len - 16
    written: set[int] = set()
    saw_gap = False
    for positions, mask in spy.calls:
        written |= set(positions.tolist())
        for query, pos in enumerate(positions.tolist()):
            seen = set(torch.nonzero(mask[0, query, prefix:])[:, 0].tolist())
            assert seen == {s for s in written if s <= pos}, "exactly the written slots up to the query"
            saw_gap |= len(seen) < pos + 1
        assert mask[:, :, :prefix].all(), "the condition prefix is always visible"
    assert saw_gap, "some query had unwritten slots before it (the mask is not plain causal)"


def test_bad_options_name_the_choices() -> None:
    with pytest.raises(ValueError, match="window"):
        ZipARDecoder(PARAMS, window=0)
    with pytest.raises(ValueError, match="written"):
        ZipARDecoder(PARAMS, window=4, mask="full")
