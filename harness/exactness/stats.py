"""Images against the exact law of a Markov target (harness/exactness/markov.py): per-position and
adjacent-pair total variation distances against a parametric-bootstrap null, and a chi-square test
per adjacent pair with a Bonferroni correction.

For images [n, N]:
- TVD_i = 1/2 sum_a |count_i(a) / n - pi_i(a)| per position, TVD_(i,i+1) likewise over the V^2
  cells of each adjacent pair; the statistics are their sums over positions and over pairs. Their
  null law is measured by drawing `replicates` sets of n images from the exact law itself (the
  parametric bootstrap): z = (observed - null mean) / null sd, and the bootstrap p-value
  (1 + #null >= observed) / (1 + replicates).
- Each pair's counts are chi-square tested against n P(x_i, x_{i+1}) (cells expecting fewer than 5
  images pooled into one); the smallest p-value times the N - 1 pairs tested is the Bonferroni-
  adjusted family p-value, and the pairs whose adjusted p falls below `alpha` are named.

A decoder fails when the adjusted chi-square p is below `alpha` (1e-3) or either TVD sum lies more
than `z_max` (4) null standard deviations above the null mean. A lossless decoder fails by chance
with probability about alpha + 2 * 3e-5 (the z bound's normal tail)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from harness.exactness.markov import MarkovLaw

ALPHA = 1e-3
Z_MAX = 4.0
MIN_EXPECTED = 5.0


def position_counts(tokens: Tensor, vocab: int) -> Tensor:
    """tokens [n, N] -> counts [N, V] float64."""
    n_pos = tokens.shape[1]
    index = torch.arange(n_pos)[None] * vocab + tokens
    return torch.bincount(index.flatten(), minlength=n_pos * vocab).view(n_pos, vocab).double()


def pair_counts(tokens: Tensor, vocab: int) -> Tensor:
    """tokens [n, N] -> counts [N-1, V, V] float64 of (x_i, x_{i+1})."""
    n_pairs = tokens.shape[1] - 1
    cell = tokens[:, :-1] * vocab + tokens[:, 1:]
    index = torch.arange(n_pairs)[None] * vocab * vocab + cell
    return torch.bincount(index.flatten(), minlength=n_pairs * vocab * vocab).view(n_pairs, vocab, vocab).double()


def tvd_sums(tokens: Tensor, law: MarkovLaw) -> tuple[float, float]:
    """(sum over positions of the marginal TVD, sum over adjacent pairs of the pair TVD)."""
    n, vocab = tokens.shape[0], law.marginals.shape[1]
    marginal = 0.5 * (position_counts(tokens, vocab) / n - law.marginals).abs().sum()
    pair = 0.5 * (pair_counts(tokens, vocab) / n - law.pairs).abs().sum()
    return float(marginal), float(pair)


def chi_square_pairs(tokens: Tensor, law: MarkovLaw) -> Tensor:
    """The chi-square p-value of each adjacent pair's counts [N-1] (cells expecting fewer than
    MIN_EXPECTED images pooled into one cell)."""
    n, vocab = tokens.shape[0], law.marginals.shape[1]
    obs = pair_counts(tokens, vocab).flatten(1)
    exp = (law.pairs * n).flatten(1)
    out = []
    for o, e in zip(obs, exp):
        big = e >= MIN_EXPECTED
        o2, e2 = o[big], e[big]
        if (~big).any() and e[~big].sum() > 0:
            o2, e2 = torch.cat([o2, o[~big].sum()[None]]), torch.cat([e2, e[~big].sum()[None]])
        dof = max(int(o2.numel()) - 1, 1)
        stat = ((o2 - e2) ** 2 / e2).sum()
        out.append(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), stat / 2.0))
    return torch.stack(out)


@dataclass(frozen=True)
class Null:
    """The bootstrap null of the two TVD sums at n images: replicates [R, 2] (marginal, pair)."""

    images: int
    sums: Tensor

    @classmethod
    def draw(cls, law: MarkovLaw, images: int, replicates: int = 200, seed: int = 0) -> "Null":
        gen = torch.Generator().manual_seed(seed)
        sums = [tvd_sums(law.sample(images, gen), law) for _ in range(replicates)]
        return cls(images=images, sums=torch.tensor(sums, dtype=torch.float64))

    def z(self, observed: tuple[float, float]) -> tuple[float, float]:
        mean, sd = self.sums.mean(0), self.sums.std(0)
        return tuple(float(v) for v in (torch.tensor(observed, dtype=torch.float64) - mean) / sd)

    def p(self, observed: tuple[float, float]) -> tuple[float, float]:
        above = (self.sums >= torch.tensor(observed, dtype=torch.float64)).sum(0)
        return tuple(float(v) for v in (1 + above) / (1 + self.sums.shape[0]))


@dataclass(frozen=True)
class Verdict:
    """One decoder's images against the law (module docstring)."""

    images: int
    steps: float  # mean target forwards per image
    marginal_tvd: float
    pair_tvd: float
    marginal_z: float
    pair_z: float
    marginal_p: float  # bootstrap p-values
    pair_p: float
    chi2_p: float  # Bonferroni-adjusted smallest pair p-value
    failing_pairs: list[int] = field(default_factory=list)  # first position i of each failing pair (i, i+1)

    @property
    def passed(self) -> bool:
        return self.chi2_p >= ALPHA and self.marginal_z <= Z_MAX and self.pair_z <= Z_MAX


def judge(tokens: Tensor, law: MarkovLaw, null: Null, steps: float) -> Verdict:
    """tokens [n, N] (n = null.images) against the law."""
    if tokens.shape[0] != null.images:
        raise ValueError(f"the null was drawn for {null.images} images, got {tokens.shape[0]}")
    observed = tvd_sums(tokens, law)
    pairs = chi_square_pairs(tokens, law) * (law.pairs.shape[0])
    (mz, pz), (mp, pp) = null.z(observed), null.p(observed)
    return Verdict(images=tokens.shape[0], steps=steps, marginal_tvd=observed[0], pair_tvd=observed[1],
                   marginal_z=mz, pair_z=pz, marginal_p=mp, pair_p=pp, chi2_p=float(pairs.min().clamp(max=1.0)),
                   failing_pairs=[int(i) for i in torch.nonzero(pairs < ALPHA).flatten()])
