"""Acceptance rules, the raster rejection scope and codebook neighbour tables, tested without a
model: exact probabilities, not samples."""
from __future__ import annotations

import pytest
import torch

from baselines.framework.acceptance import LanternRule, lantern_boost, speculative_verdict
from baselines.framework.scope import RasterScope
from baselines.framework.neighbours import compute_neighbours, neighbour_table
from tests.single_thread import single_thread  # noqa: F401  (autouse)


def _output_distribution(p: torch.Tensor, q: torch.Tensor | None, grid: int = 20000) -> torch.Tensor:
    """The distribution of the committed token at one position: the draft x ~ q (uniformly chosen
    when q is None, i.e. a deterministic draft), accepted as the rule says for u on a fine grid of
    [0, 1) (P(u < a) exact to 1 / grid), else drawn from the residual. p, q [V] -> [V]."""
    v = p.shape[0]
    u = (torch.arange(grid) + 0.5) / grid
    out = torch.zeros(v)
    for x in range(v):
        weight = q[x] if q is not None else 1.0 / v
        verdict = speculative_verdict(p.expand(1, grid, v), None if q is None else q.expand(1, grid, v),
                                      torch.full((1, grid), x), u[None])
        accept = verdict.accept.float().mean()
        out += weight * (accept * torch.eye(v)[x] + (1 - accept) * verdict.residual[0, 0])
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_speculative_sampling_outputs_p(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(6, generator=g) ** 3
    p[2] = 0.0  # a token excluded by top-k
    p /= p.sum()
    q = torch.rand(6, generator=g).softmax(0)
    assert torch.allclose(_output_distribution(p, q), p, atol=2e-4)
    # a deterministic draft (q = one-hot) is lossless too, whatever token was chosen
    assert torch.allclose(_output_distribution(p, None), p, atol=2e-4)


def test_speculative_sampling_with_a_wrong_residual_is_caught() -> None:
    """The check above can fail: resampling from p instead of the residual is biased."""
    p = torch.tensor([0.7, 0.2, 0.1, 0.0])
    q = torch.tensor([0.1, 0.1, 0.2, 0.6])
    u = (torch.arange(20000) + 0.5) / 20000
    out = torch.zeros(4)
    for x in range(4):
        accept = speculative_verdict(p.expand(1, 20000, 4), q.expand(1, 20000, 4), torch.full((1, 20000), x),
                                     u[None]).accept.float().mean()
        out += q[x] * (accept * torch.eye(4)[x] + (1 - accept) * p)
    assert (out - p).abs().sum() > 0.1


def test_greedy_verdict_accepts_only_the_argmax() -> None:
    p = torch.tensor([[[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]])  # greedy p is one-hot
    q = torch.full((1, 2, 3), 1 / 3)
    verdict = speculative_verdict(p, q, torch.tensor([[1, 2]]), torch.tensor([[0.999, 0.0]]))
    assert verdict.accept.tolist() == [[True, False]]
    assert verdict.residual[0, 1].tolist() == [1.0, 0.0, 0.0]


def test_lantern_boost_moves_the_nearest_mass_within_delta() -> None:
    # codes on a line: neighbours of code 2 are 1, 3, 0, 4 (ties -> lower index first)
    codebook = torch.tensor([[0.0], [1.0], [2.0], [3.0], [4.0]])
    table = compute_neighbours(codebook, 4)
    assert table[2].tolist() == [1, 3, 0, 4]
    p = torch.tensor([0.1, 0.15, 0.3, 0.2, 0.25])
    boosted = lantern_boost(p.expand(1, 1, 5), torch.tensor([[2]]), table, delta=0.4)[0, 0]
    # cumulative neighbour mass 0.15, 0.35, 0.45: the first two fit in delta = 0.4
    assert torch.allclose(boosted, torch.tensor([0.1, 0.0, 0.65, 0.0, 0.25]))
    assert torch.isclose(boosted.sum(), torch.tensor(1.0))
    assert torch.isclose(0.5 * (boosted - p).abs().sum(), torch.tensor(0.35)), "TVD = moved mass <= delta"


def test_lantern_boost_with_zero_delta_is_p_bit_for_bit() -> None:
    g = torch.Generator().manual_seed(0)
    codebook = torch.randn(16, 4, generator=g)
    p = torch.randn(3, 5, 16, generator=g).softmax(-1)
    p[..., :4] = 0.0  # zero-mass neighbours are "moved" for free: still bit-identical
    drafts = torch.randint(16, (3, 5), generator=g)
    boosted = lantern_boost(p, drafts, compute_neighbours(codebook, 15), delta=0.0)
    assert torch.equal(boosted, p)


def test_lantern_rule_rejects_bad_options() -> None:
    with pytest.raises(ValueError, match="delta"):
        LanternRule(k=10, delta=1.5)
    with pytest.raises(ValueError, match="k"):
        LanternRule(k=0, delta=0.1)


def test_lantern_residual_leaves_out_the_absorbed_neighbours() -> None:
    codebook = torch.tensor([[0.0], [1.0], [2.0], [3.0]])
    table = compute_neighbours(codebook, 3)
    p = torch.tensor([[[0.3, 0.1, 0.2, 0.4]]])
    boosted = lantern_boost(p, torch.tensor([[0]]), table, delta=0.15)  # absorbs code 1
    verdict = speculative_verdict(boosted, None, torch.tensor([[0]]), torch.tensor([[0.99]]))
    assert not verdict.accept.item()
    assert torch.allclose(verdict.residual[0, 0], torch.tensor([0.0, 0.0, 1 / 3, 2 / 3]))


def test_raster_scope_keeps_the_accepted_run_per_row() -> None:
    accept = torch.tensor([[True, True, False, True], [True, True, True, True], [False, True, True, True],
                           [True, True, True, True], [True, False, True, True]])
    remaining = torch.tensor([10, 10, 10, 3, 0])  # row 3 ends inside the window, row 4 finished
    res = RasterScope().resolve(accept, remaining)
    assert res.first.tolist() == [2, 4, 0, 3, 0]
    assert res.advance.tolist() == [3, 5, 1, 3, 0]
    assert res.kv_valid.tolist() == [2, 4, 0, 3, 0]
    assert res.rejected.sum(-1).tolist() == [1, 0, 1, 0, 0]
    assert res.keep.sum(-1).tolist() == [2, 4, 0, 3, 0]
    assert not res.resample.any()


def test_neighbour_table_matches_brute_force_and_is_cached() -> None:
    g = torch.Generator().manual_seed(1)
    codebook = torch.randn(40, 8, generator=g)
    table = neighbour_table(codebook, 5)
    dist = torch.cdist(codebook, codebook)
    dist.fill_diagonal_(float("inf"))
    assert torch.equal(table, dist.argsort(1)[:, :5])
    assert (table != torch.arange(40)[:, None]).all(), "a code is not its own neighbour"
    assert neighbour_table(codebook.clone(), 5) is table, "same values: the cached table"
    assert neighbour_table(codebook + 1e-3, 5) is not table
    assert neighbour_table(codebook, 1000).shape == (40, 39), "k is clamped to V - 1"
