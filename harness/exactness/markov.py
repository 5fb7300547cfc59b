"""A first-order Markov "image model": token i + 1 depends on token i alone, through a
position-dependent transition matrix, so the law of every position and of every adjacent pair is
known in closed form. It satisfies the model contract (harness/api.py, ARImageModel): prefill,
forward at positions with a mask and cache slots (ignored: the next token's law reads only the
input token and its position), scratch slots and move_cache (no-ops), a token embedding (GSD's
groups) and a codebook. Every decoder of the harness runs on it unchanged; its images are checked
against `MarkovLaw` by harness/exactness/stats.py.

Law, for a grid of N = rows * cols positions over V codes:
    x_0 ~ softmax(init)                        init [V]
    x_{i+1} | x_i ~ softmax(trans[i, x_i])     trans [N, V, V] (row N - 1 never used by the law)
    P(x_i = a) = pi_i[a],  pi_{i+1} = pi_i @ T_i,  P(x_i = a, x_{i+1} = b) = pi_i[a] T_i[a, b].
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from harness.api import ConfigValueError, ModelBundle, checked_number
from harness.models.conditioners import HashedWordConditioner

PREFIX = 4  # condition tokens the conditioner makes (the model reads only their batch size)


class MarkovImageModel:
    """The Markov target behind the ARImageModel contract.

    Args:
        init: logits of position 0 [V].
        trans: transition logits [N, V, V]: trans[i, a] are the logits of x_{i+1} given x_i = a.
        grid: (rows, cols), rows * cols = N.
        embeddings: the token embedding [V, dim] GSD's groups are measured in.
    """

    def __init__(self, init: Tensor, trans: Tensor, grid: tuple[int, int], embeddings: Tensor) -> None:
        self.init, self.trans = init.float(), trans.float()
        self.grid = grid
        self.vocab_size = int(init.shape[0])
        self.token_embeddings = embeddings.float()
        self.batch = 0

    @property
    def codebook(self) -> Tensor:
        return self.token_embeddings

    @property
    def cache_len(self) -> int:
        return PREFIX + self.grid[0] * self.grid[1]

    def setup_cache(self, batch_size: int, scratch: int = 0) -> None:
        """No cache is kept: the next token's law reads only the input token."""
        self.batch = batch_size

    def prefill(self, cond) -> Tensor:
        """cond of batch B -> logits [B, V] of position 0."""
        return self.init.expand(cond.batch_size, -1).clone()

    def forward(self, tokens: Tensor, positions: Tensor, mask: Tensor | None = None,
                slots: Tensor | None = None) -> Tensor:
        """tokens [B, T] at positions [T] or [B, T] -> logits [B, T, V] of positions + 1 (mask and
        slots are accepted and ignored: no input but the token itself matters)."""
        pos = positions.expand_as(tokens).clamp(0, self.trans.shape[0] - 1)
        return self.trans[pos, tokens]

    def move_cache(self, src: Tensor, dst: Tensor) -> None:
        """Accepted draft-tree nodes move to their slots: nothing to move (no cache)."""

    def decode(self, tokens: Tensor) -> Tensor:
        """tokens [B, N] -> grey images [B, 3, rows, cols] uint8 (code c at level 255 c / (V - 1))."""
        rows, cols = self.grid
        level = (tokens.float() * 255.0 / max(self.vocab_size - 1, 1)).round().to(torch.uint8)
        return level.view(-1, 1, rows, cols).expand(-1, 3, -1, -1).clone()


@dataclass(frozen=True)
class MarkovLaw:
    """The exact law of a MarkovImageModel (float64): marginals [N, V], pairs [N-1, V, V] (the
    joint of positions i, i + 1), transitions [N-1, V, V] and the initial p [V]."""

    initial: Tensor
    transitions: Tensor
    marginals: Tensor
    pairs: Tensor

    @classmethod
    def of(cls, model: MarkovImageModel) -> "MarkovLaw":
        n = model.grid[0] * model.grid[1]
        initial = model.init.double().softmax(-1)
        transitions = model.trans[: n - 1].double().softmax(-1)
        marginals = [initial]
        for i in range(n - 1):
            marginals.append(marginals[-1] @ transitions[i])
        pi = torch.stack(marginals)
        return cls(initial=initial, transitions=transitions, marginals=pi, pairs=pi[:-1, :, None] * transitions)

    def sample(self, images: int, generator: torch.Generator) -> Tensor:
        """`images` sequences drawn from the law [images, N] int64 (the bootstrap's null)."""
        n = self.marginals.shape[0]
        out = torch.empty(images, n, dtype=torch.long)
        out[:, 0] = torch.multinomial(self.initial.expand(images, -1), 1, generator=generator)[:, 0]
        for i in range(n - 1):
            out[:, i + 1] = torch.multinomial(self.transitions[i, out[:, i]], 1, generator=generator)[:, 0]
        return out


def markov_bundle(rows: int = 6, cols: int = 6, vocab: int = 4, sharpness: float = 2.0,
                  seed: int = 0) -> ModelBundle:
    """The Markov target as a model bundle: logits N(0, sharpness^2) per (position, code, code),
    drawn from `seed`; codes 2k and 2k + 1 sit 0.1 apart in the token embedding, other pairs
    farther than 1, so GSD finds groups at its thresholds. Its `small_drafter` is another Markov
    model, the target's logits plus N(0, 1) (drawn after them), for `sd`."""
    for key, value in (("rows", rows), ("cols", cols), ("vocab", vocab)):
        checked_number(f"exactness.{key}", value, integer=True, low=2)
    if not sharpness > 0:
        raise ConfigValueError(f"exactness.sharpness must be > 0, got {sharpness!r}")
    gen = torch.Generator().manual_seed(seed)
    n = rows * cols
    init = torch.randn(vocab, generator=gen) * sharpness
    trans = torch.randn(n, vocab, vocab, generator=gen) * sharpness
    codes = torch.arange(vocab, dtype=torch.float32)
    embeddings = torch.stack([(codes // 2) * 2.0, (codes % 2) * 0.1 ** 0.5], -1)  # [V, 2]
    model = MarkovImageModel(init, trans, (rows, cols), embeddings)
    # a drafting model for draft-model speculative decoding (`sd`): the target's logits plus N(0, 1)
    drafter_init = init + torch.randn(vocab, generator=gen)
    drafter_trans = trans + torch.randn(n, vocab, vocab, generator=gen)
    drafter = MarkovImageModel(drafter_init, drafter_trans, (rows, cols), embeddings)
    return ModelBundle(name="markov", target=model, small_drafter=drafter,
                       conditioner=HashedWordConditioner(17, PREFIX),
                       weights_id=f"markov-{rows}x{cols}-v{vocab}-s{sharpness}-seed{seed}")
