"""Training masks for parallel decoding (harness/shapes/parallel_masks.py): they hide exactly what
the ZipAR decoder has not written yet, and follow the island schedule's row lag."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from baselines.methods.zipar import zipar_schedule
from harness.shapes.parallel_masks import random_region, region_steps, sample_hidden, zipar_hidden


def _unwritten_by_zipar(rows: int, cols: int, window: int) -> torch.Tensor:
    """[N, N]: when ZipAR decodes token i, the slot of token j (j < i - 1) is not written yet or
    holds a stand-in (which MuLo-SD's masked resampler hides from every other query)."""
    n = rows * cols
    unwritten = torch.zeros(n, n, dtype=torch.bool)
    real: set[int] = set()
    for step in zipar_schedule(rows, cols, window):
        real |= {s for s, src in zip(step.slots.tolist(), step.sources.tolist()) if s == src}
        for i in step.decoded.tolist():
            for j in range(i - 1):
                unwritten[i, j] = j not in real
    return unwritten


@pytest.mark.parametrize("window", [1, 2, 3, 4])
def test_whole_grid_hides_what_zipar_has_not_decoded(window: int) -> None:
    rows, cols = 5, 6
    region = torch.ones(rows, cols, dtype=torch.bool)
    expected = _unwritten_by_zipar(rows, cols, window)
    assert expected.any()
    assert torch.equal(zipar_hidden(region, window), expected)


def test_raster_window_hides_nothing_and_outside_tokens_stay_visible() -> None:
    assert not zipar_hidden(torch.ones(4, 4, dtype=torch.bool), 4).any()
    region = torch.zeros(6, 6, dtype=torch.bool)
    region[2:5, 1:5] = True
    hidden = zipar_hidden(region, 1)
    outside = ~region.flatten()
    assert not hidden[:, outside].any() and not hidden[outside].any()
    # region row 3 lags row 2 by one token: token (3, 2) cannot see (2, 3) or (2, 4), sees (2, 1..2)
    i = 3 * 6 + 2
    assert hidden[i].nonzero().flatten().tolist() == [2 * 6 + 3, 2 * 6 + 4]
    steps = region_steps(region, 1).view(6, 6)
    assert steps[2, 1:5].tolist() == [0, 1, 2, 3] and steps[4, 1:5].tolist() == [2, 3, 4, 5]
    assert steps[0, 0] == -1


def test_sampled_masks_are_seeded_and_follow_the_fraction() -> None:
    a = sample_hidden(np.random.default_rng([3, 7]), 64, (8, 8), 0.5, (1, 2))
    b = sample_hidden(np.random.default_rng([3, 7]), 64, (8, 8), 0.5, (1, 2))
    assert a is not None and torch.equal(a, b)
    masked = a.flatten(1).any(-1).float().mean().item()
    assert 0.3 < masked < 0.7
    assert sample_hidden(np.random.default_rng(0), 4, (8, 8), 0.0, (1,)) is None
    with pytest.raises(ValueError, match="parallel_fraction"):
        sample_hidden(np.random.default_rng(0), 4, (8, 8), 1.5, (1,))
    with pytest.raises(ValueError, match="parallel_windows"):
        sample_hidden(np.random.default_rng(0), 4, (8, 8), 0.5, (0, 2))
    region = random_region(np.random.default_rng(5), (8, 8), whole=0.0)
    r, c = region.nonzero().T
    assert region.sum() == (r.max() - r.min() + 1) * (c.max() - c.min() + 1) >= 4
