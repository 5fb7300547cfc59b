"""Dynamic draft trees (EAGLE-2, Li et al. 2024): the candidate pool a drafter grows, the rerank
to `total_tokens`, and the structures that verification and acceptance read.

Growth (baselines/methods/eagle.py): the root's top-k children start the pool; each of `depth` expansions
feeds the k pool nodes of highest cumulative draft log-probability of the newest level to the
drafter, and every fed node adds its top-k children (cumulative score = parent's + the child's
log q). The pool then holds top_k + depth * top_k^2 nodes on depth + 1 levels.

Rerank (`select`): the total_tokens - 1 nodes of highest cumulative score, ties to the earlier
pool index. A child's score is at most its parent's and its pool index is larger, so the chosen
set holds every chosen node's parent: a tree. Its block layout: index 0 is the root (the last
committed token, not yet encoded by the target), indices 1..m the chosen nodes in pool order, so
every parent comes before its children.

    tokens    [B, m]          the nodes' tokens (block indices 1..m)
    depth     [B, m]          1 for the root's children, ... (a depth-d node proposes position root + d)
    parent    [B, m]          block index of the parent (0 = the root)
    rank      [B, m]          the node's rank among its siblings (0 = the drafter's first choice)
    children  [B, 1+m, K]     block indices of each node's children by rank, -1 = none
    ancestry  [B, 1+m, 1+m]   ancestry[b, i, j]: node j is node i or one of its ancestors
    q         [B, 1+m, V]     (sampled static trees only, else None) the drafter's distribution
                              each node's children were drawn from (baselines/methods/static_tree.py)
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from harness.api import ConfigValueError, checked_number


@dataclass(frozen=True)
class TreeOptions:
    """EAGLE-2's tree options, checked at construction (errors name the option and its bound).

    Args:
        depth: expansions after the root's (drafts reach depth + 1 tokens past the root; LANTERN on
            LlamaGen: 4, upstream EAGLE-2: 5).
        top_k: children per expanded node and nodes expanded per level (both: 10).
        total_tokens: tokens verified per round, the root included (both: 59); at most 1 + the
            pool's top_k + depth * top_k^2 nodes.
    """

    depth: int = 4
    top_k: int = 10
    total_tokens: int = 59

    def __post_init__(self) -> None:
        checked_number("decoder draft.depth", self.depth, integer=True, low=1)
        checked_number("decoder draft.top_k", self.top_k, integer=True, low=1)
        checked_number("decoder draft.total_tokens", self.total_tokens, integer=True, low=2)
        if self.nodes > self.pool:
            raise ConfigValueError(
                f"decoder draft.total_tokens ({self.total_tokens}) must be at most 1 + the candidate pool "
                f"of draft.top_k + draft.depth x draft.top_k^2 = {self.top_k} + {self.depth} x "
                f"{self.top_k}^2 = {self.pool} nodes, i.e. <= {self.pool + 1}")

    @property
    def levels(self) -> int:
        """Draft levels: the root's children plus one per expansion."""
        return self.depth + 1

    @property
    def pool(self) -> int:
        return self.top_k + self.depth * self.top_k ** 2

    @property
    def nodes(self) -> int:
        """Drafted nodes verified per round (the root excluded)."""
        return self.total_tokens - 1

    def check_vocab(self, vocab: int, model: str) -> None:
        """top_k children need a vocabulary of at least top_k codes."""
        if self.top_k > vocab:
            raise ConfigValueError(f"decoder draft.top_k ({self.top_k}) exceeds the vocabulary of model "
                                   f"{model!r} ({vocab} codes); choose draft.top_k <= {vocab}")


@functools.lru_cache(maxsize=32)
def pool_layout(depth: int, top_k: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """The depth and sibling rank of every pool index [top_k + depth * top_k^2] each (the same in every
    round): top_k root children at depth 1, then top_k^2 per expansion, each fed node's children
    side by side in rank order. Made once per (depth, top_k, device); read them, never write them."""
    ranks = torch.arange(top_k, device=device)
    depths = [torch.ones(top_k, dtype=torch.long, device=device)]
    depths += [torch.full((top_k * top_k,), i + 2, device=device) for i in range(depth)]
    return torch.cat(depths), torch.cat([ranks, ranks.repeat(depth * top_k)])


class Pool:
    """The candidate pool of one round, grown level by level (pool index order: a parent always has
    a smaller index than its children): tokens, parent (pool index, -1 = the root) and score
    (cumulative log q) [B, n] per level; depth and rank [n] come from `pool_layout`."""

    def __init__(self, options: TreeOptions, device: torch.device) -> None:
        self.depth, self.rank = pool_layout(options.depth, options.top_k, device)
        self.levels = options.levels
        self.fields: dict[str, list[Tensor]] = {k: [] for k in ("tokens", "parent", "score")}

    @property
    def size(self) -> int:
        return sum(t.shape[1] for t in self.fields["tokens"])

    def add(self, tokens: Tensor, parent: Tensor, score: Tensor) -> None:
        """The next level's nodes, in `pool_layout` order: tokens, parent, score [B, n]."""
        self.fields["tokens"].append(tokens)
        self.fields["parent"].append(parent)
        self.fields["score"].append(score.float())

    def get(self, name: str) -> Tensor:
        return torch.cat(self.fields[name], dim=1)


@dataclass(frozen=True)
class DraftTree:
    """A reranked draft tree per row (module docstring for every field)."""

    tokens: Tensor
    depth: Tensor
    parent: Tensor
    rank: Tensor
    score: Tensor
    children: Tensor
    ancestry: Tensor
    q: Tensor | None = None

    @property
    def nodes(self) -> int:
        return self.tokens.shape[1]


def select(pool: Pool, nodes: int, top_k: int) -> DraftTree:
    """The `nodes` best pool nodes of each row as a DraftTree (rerank: module docstring); top_k:
    the most children of a node."""
    score = pool.get("score")
    order = torch.sort(score, dim=1, descending=True, stable=True).indices[:, :nodes]
    chosen = torch.sort(order, dim=1).values  # pool order: parents first
    # block index of the parent = how many chosen nodes precede it or are it (0 for the root, -1)
    parent = torch.searchsorted(chosen, pool.get("parent").gather(1, chosen), right=True)
    rank = pool.rank[chosen]
    return DraftTree(tokens=pool.get("tokens").gather(1, chosen), depth=pool.depth[chosen], parent=parent,
                     rank=rank, score=score.gather(1, chosen), children=children_table(parent, rank, top_k),
                     ancestry=ancestry(parent, pool.levels))


def children_table(parent: Tensor, rank: Tensor, top_k: int) -> Tensor:
    """parent, rank [B, m] -> children [B, 1+m, top_k]: block index of the child of each rank."""
    b, m = parent.shape
    table = torch.full((b, 1 + m, top_k), -1, dtype=torch.long, device=parent.device)
    node = torch.arange(1, m + 1, device=parent.device).expand(b, -1)
    table.view(b, -1).scatter_(1, parent * top_k + rank, node)
    return table


def ancestry(parent: Tensor, max_depth: int | None = None) -> Tensor:
    """parent [B, m] (block indices, 0 = the root) -> [B, 1+m, 1+m] bool: anc[b, i, j] = node j
    is node i or an ancestor of i (the root is everyone's). `max_depth`: the deepest node's depth
    (default m), the number of steps up the tree."""
    b, m = parent.shape
    up = torch.cat([torch.zeros(b, 1, dtype=torch.long, device=parent.device), parent], 1)  # root -> root
    steps = [up]  # each node's ancestor t + 1 steps up (the root once reached), t = 0 .. max_depth - 1
    for _ in range((m if max_depth is None else max_depth) - 1):
        steps.append(up.gather(1, steps[-1]))
    anc = torch.zeros(b, 1 + m, 1 + m, dtype=torch.bool, device=parent.device)
    itself = torch.eye(1 + m, dtype=torch.bool, device=parent.device)
    return anc.scatter_(2, torch.stack(steps, 2), True) | itself


def tree_attention(anc: Tensor, root_slot: Tensor, scratch: int, width: int) -> Tensor:
    """The verification mask of a tree block [B, 1+m, width] (True = attend) over a cache whose
    slots <= root_slot [B] hold the committed sequence and the root (written by this forward), and
    whose slots scratch .. scratch + m - 1 hold the block's nodes 1..m: every query sees the
    sequence up to the root and its own ancestors-or-self among the nodes."""
    b, n, _ = anc.shape
    key = torch.arange(width, device=anc.device)
    mask = (key[None, None, :] <= root_slot[:, None, None]).expand(b, n, width).clone()
    mask[:, :, scratch:scratch + n - 1] = anc[:, :, 1:]
    return mask
