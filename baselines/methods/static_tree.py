"""`static_tree` draft source: LANTERN++'s static draft tree (Park et al., ICLR 2025 workshop SCOPE;
github jadohu/LANTERN @3a56e45, `--static_tree`: models/ea_model_llamagen.py `generate` with
`tree_choices=naive_extend_57`, models/drafters/cnets_llamagen.py `topK_genrate_v1` and `sample`,
models/drafters/choices.py). The target's EAGLE head (baselines/methods/eagle.py) drafts a tree of
FIXED topology each round, verified like EAGLE-2's trees (baselines/methods/tree_decoding.py).

A topology is a list of paths of sibling ranks: [0] is the root's first child, [0, 1] the second
child of [0], ... Nodes take block indices 1..m in (depth, path) order (LANTERN's
`sorted(tree_choices, key=lambda x: (len(x), x))`), so parents come before their children.

Drafting, per round: the head's catch-up output drafts the root's children; then, level by level,
the nodes that have children in the topology are fed to the head (features: their parent's head
output; each attends to the head's cache and its fed ancestors) and their outputs draft the next
level. With sampling, each node's c children are drawn from the head's filtered, CFG-mixed
distribution q WITHOUT replacement, in rank order (LANTERN's `sample`: multinomial without
replacement), by inverse-CDF draws from the per-image streams; q is kept per node for the
acceptance rule (DraftTree.q; baselines/methods/lantern_pp.py). Greedy: the top-c codes, q = None.

Per round: 1 catch-up + (levels - 1) head forwards (the deepest level is not fed), levels x top_k
+ 1 uniforms for the verification (tree_decoding.py) and, when sampling, top_k per parent node
for the drafts, every round, used or not.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from baselines.framework.canvas import span
from baselines.framework.draft_tree import DraftTree, ancestry, children_table
from baselines.methods.eagle import EagleRun, check_head
from harness.api import ConfigValueError, SamplingParams
from harness.runtime.randomness import ImageStreams
from harness.runtime.sampling import inverse_cdf

# LANTERN's models/drafters/choices.py (constants): naive_extend_57 is the default of its
# `generate(static_tree=True)`; mc_sim_7b_63 the default of its `--tree_choices` flag.
TREES: dict[str, list[list[int]]] = {
    "naive_extend_57": (
        [[0], [1], [2], [3], [4]]
        + [[0, 0], [0, 1], [0, 2], [0, 3], [1, 0], [1, 1], [1, 2], [2, 0], [2, 1], [2, 2], [3, 0], [3, 1], [4, 0]]
        + [[0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 0, 3], [0, 1, 0], [0, 1, 1], [0, 1, 2], [0, 2, 0], [0, 2, 1],
           [0, 2, 2], [0, 3, 0], [0, 3, 1], [1, 0, 0], [1, 0, 1], [1, 1, 0], [2, 0, 0]]
        + [[0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 3], [0, 0, 1, 0], [0, 0, 1, 1], [0, 0, 1, 2],
           [0, 0, 2, 0], [0, 0, 2, 1], [0, 0, 3, 0], [0, 1, 0, 0], [0, 1, 0, 1], [0, 1, 1, 0], [0, 2, 0, 0]]
        + [[0, 0, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 2], [0, 0, 0, 1, 0], [0, 0, 0, 1, 1], [0, 0, 1, 0, 0],
           [0, 0, 1, 0, 1], [0, 0, 1, 1, 0], [0, 0, 2, 0, 0]]),
    "mc_sim_7b_63": (
        [[0], [1], [2], [3], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0], [2, 1], [3, 0]]
        + [[0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 1, 1], [0, 2, 0], [0, 2, 1], [1, 0, 0]]
        + [[0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 0, 0], [0, 0, 0, 0, 1]]),
}


@dataclass(frozen=True)
class StaticTree:
    """A checked static topology (module docstring), with what TreeDecoder reads of tree options:
    `nodes` (m), `levels` (the deepest path's length) and `top_k` (the most children of a node).

    Per level l = 1 .. levels (lists of plain ints, block indices):
        level_nodes[l]  the depth-l nodes; source[l] the place of each one's parent in parents[l-1];
        rank[l]         its sibling rank;
        parents[l-1]    the nodes of depth l-1 that have children (parents[0] = [0], the root);
        fed             every parent below the root, level by level: fed slot i holds fed[i].
    """

    name: str
    paths: tuple[tuple[int, ...], ...]
    parent: tuple[int, ...]
    depth: tuple[int, ...]
    rank: tuple[int, ...]

    @classmethod
    def of(cls, tree: str | list) -> "StaticTree":
        """A named tree (TREES) or a list of rank paths, checked (errors name `decoder draft.tree`)."""
        if isinstance(tree, str):
            if tree not in TREES:
                raise ConfigValueError(f"decoder draft.tree {tree!r} is not a known static tree; use one of "
                                       f"{sorted(TREES)} or a list of rank paths like [[0], [1], [0, 0]]")
            name, raw = tree, TREES[tree]
        else:
            name, raw = "custom", tree
        try:
            paths = [tuple(_rank(r) for r in path) for path in raw]
            raw = list(raw)
        except (TypeError, ValueError):
            raise ConfigValueError(f"decoder draft.tree must be a tree name or a list of rank paths (lists of "
                                   f"integers), got {tree!r}") from None
        if not paths or any(not path or min(path) < 0 for path in paths):
            raise ConfigValueError("decoder draft.tree needs at least one path, each a non-empty list of ranks "
                                   f">= 0; got {tree!r}")
        paths = sorted(set(paths), key=lambda x: (len(x), x))
        if len(paths) != len(raw):
            raise ConfigValueError(f"decoder draft.tree lists a path twice: {tree!r}")
        index = {path: i + 1 for i, path in enumerate(paths)}
        for path in paths:
            if len(path) > 1 and path[:-1] not in index:
                raise ConfigValueError(f"decoder draft.tree: path {list(path)} has no parent {list(path[:-1])}")
            if path[-1] > 0 and path[:-1] + (path[-1] - 1,) not in index:
                raise ConfigValueError(f"decoder draft.tree: path {list(path)} skips rank {path[-1] - 1}; a node's "
                                       "children are drawn in rank order, so their ranks run 0, 1, 2, ... "
                                       "without gaps")
        return cls(name=name, paths=tuple(paths), parent=tuple(index.get(p[:-1], 0) for p in paths),
                   depth=tuple(len(p) for p in paths), rank=tuple(p[-1] for p in paths))

    @property
    def nodes(self) -> int:
        return len(self.paths)

    @property
    def levels(self) -> int:
        return max(self.depth)

    @property
    def top_k(self) -> int:
        return max(self.rank) + 1

    @functools.cached_property
    def parents(self) -> list[list[int]]:
        """parents[d]: the depth-d nodes with children (block indices; parents[0] = [0])."""
        having = set(self.parent)
        return [[0]] + [[i + 1 for i in range(self.nodes) if self.depth[i] == d and i + 1 in having]
                        for d in range(1, self.levels)]

    @property
    def fed(self) -> list[int]:
        return [node for level in self.parents[1:] for node in level]

    def level_nodes(self, depth: int) -> list[int]:
        return [i + 1 for i in range(self.nodes) if self.depth[i] == depth]

    def source(self, depth: int) -> list[int]:
        """The place of each depth-`depth` node's parent in parents[depth - 1]."""
        return [self.parents[depth - 1].index(self.parent[n - 1]) for n in self.level_nodes(depth)]

    def widths(self, depth: int) -> int:
        """The most children of a depth-`depth` parent."""
        return max(self.rank[n - 1] for n in self.level_nodes(depth + 1)) + 1

    def check_fits(self, vocab: int, n_tokens: int, model: str) -> None:
        """c children without replacement need c codes; a path longer than the image predicts
        nothing (and would not fit the tree verification's positions)."""
        if self.top_k > vocab:
            raise ConfigValueError(f"decoder draft.tree {self.name!r} gives a node {self.top_k} children, more than "
                                   f"the {vocab} codes of model {model!r}; choose a narrower tree")
        if self.levels >= n_tokens:
            raise ConfigValueError(f"decoder draft.tree {self.name!r} is {self.levels} levels deep, more than the "
                                   f"{n_tokens - 1} tokens after the first of model {model!r}'s image; choose a "
                                   "shallower tree")


def _rank(value: object) -> int:
    """A sibling rank: an integer (not a bool), else TypeError."""
    if isinstance(value, bool) or int(value) != value:  # type: ignore[call-overload]
        raise TypeError(value)
    return int(value)  # type: ignore[call-overload]


class StaticTreeDraft:
    """`static_tree`: LANTERN++'s static tree drafted by the target's EAGLE head.

    Args:
        tree: a name in TREES (LANTERN++: "naive_extend_57") or a list of rank paths.
    """

    name = "static_tree"

    def __init__(self, tree: str | list = "naive_extend_57") -> None:
        self.options = StaticTree.of(tree)

    def start(self, target, head, sampling: SamplingParams, model: str,  # noqa: ANN001
              streams: ImageStreams | None = None) -> "StaticRun":
        """The per-call drafting state (EagleDraft.start); sampled trees need `streams`."""
        check_head(target, head, model)
        rows, cols = target.grid
        self.options.check_fits(int(target.vocab_size), rows * cols, model)
        if streams is None and not sampling.greedy:
            raise ValueError("a sampled static tree draws its drafts from the per-image random streams: pass streams")
        return StaticRun(self.options, target, head, sampling, streams)


@dataclass(frozen=True)
class _Layout:
    """The topology's index tensors on one device: per depth d = 1 .. levels, the depth-d nodes
    (`nodes[d]`), their parents' places in the parent list (`source[d]`) and their ranks
    (`rank[d]`); per depth d = 1 .. levels - 1 the fed parents' places among the depth-d nodes
    (`fed_at[d]`) and fed slots (`slots[d]`); the fed ancestry [F, F]; and the DraftTree's fixed
    fields for one row (depth, parent, rank [m]; children [1+m, K]; ancestry [1+m, 1+m])."""

    nodes: dict[int, Tensor]
    source: dict[int, Tensor]
    rank: dict[int, Tensor]
    fed_at: dict[int, Tensor]
    slots: dict[int, Tensor]
    fed_anc: Tensor
    depth: Tensor
    parent: Tensor
    ranks: Tensor
    children: Tensor
    ancestry: Tensor


def _layout(tree: StaticTree, device: torch.device) -> _Layout:
    def t(values: list[int]) -> Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    parent, rank = t(list(tree.parent))[None], t(list(tree.rank))[None]
    anc = ancestry(parent, tree.levels)[0]  # [1+m, 1+m]
    fed = tree.fed
    slot_of = {node: i for i, node in enumerate(fed)}
    nodes, source, ranks, fed_at, slots = {}, {}, {}, {}, {}
    for d in range(1, tree.levels + 1):
        level = tree.level_nodes(d)
        nodes[d], source[d] = t(level), t(tree.source(d))
        ranks[d] = t([tree.rank[n - 1] for n in level])
        if d < tree.levels:
            fed_at[d] = t([level.index(n) for n in tree.parents[d]])
            slots[d] = t([slot_of[n] for n in tree.parents[d]])
    fed_index = t(fed)
    return _Layout(nodes=nodes, source=source, rank=ranks, fed_at=fed_at, slots=slots,
                   fed_anc=anc[fed_index][:, fed_index], depth=t(list(tree.depth)), parent=parent[0],
                   ranks=rank[0], children=children_table(parent, rank, tree.top_k)[0], ancestry=anc)


class StaticRun(EagleRun):
    """One generate call's head state for a static tree (EagleRun's catch-up, a fixed expansion)."""

    def __init__(self, tree: StaticTree, target, head, sampling: SamplingParams,  # noqa: ANN001
                 streams: ImageStreams | None) -> None:
        super().__init__(tree, target, head, sampling)  # type: ignore[arg-type]
        self.tree, self.streams = tree, streams
        self._where: _Layout | None = None

    def fed_slots(self) -> int:
        return len(self.options.fed)  # type: ignore[attr-defined]

    def expand(self, root: Tensor) -> DraftTree:
        """The round's tree for roots at image positions root [B]: levels - 1 head forwards after
        the catch-up; q [B, 1+m, V] when sampling."""
        assert self.last is not None and self.last_slot is not None, "catch_up comes first"
        tree, b, device = self.tree, root.shape[0], root.device
        if self._where is None:
            self._where = _layout(tree, device)
        at = self._where
        greedy = self.sampling.greedy
        out = self.last[:, None]  # [R, 1, dim]: the head output of the root, the only depth-0 parent
        logq = self._logq(out)  # [B, P, V] over the parents of the newest level
        tokens = torch.zeros(b, tree.nodes, dtype=torch.long, device=device)
        q = None if greedy else torch.zeros(b, 1 + tree.nodes, logq.shape[-1], device=device)
        seen = (span(self.scratch, device) <= self.last_slot[:, None])[:, None]  # [B, 1, scratch]
        for d in range(1, tree.levels + 1):
            width = tree.widths(d - 1)
            parents = torch.tensor(tree.parents[d - 1], device=device)
            if greedy:
                kids = torch.topk(logq, width, dim=-1).indices  # [B, P, c]
            else:
                dist = logq.exp()
                q[:, parents] = dist  # type: ignore[index]
                kids = self._draw(dist, width)
            level = kids[:, at.source[d], at.rank[d]]  # [B, n_d]
            tokens[:, at.nodes[d] - 1] = level
            if d == tree.levels:
                break
            fed, slots = at.fed_at[d], at.slots[d]  # [F_d]
            n = fed.numel()
            feats = out[:, at.source[d][fed]]  # [R, F_d, dim]: each fed node's parent output
            seq = (self.prefix + root[:, None] + d).clamp(max=self.prefix + self.n_tokens - 1).expand(-1, n)
            anc = at.fed_anc[slots][None].expand(b, -1, -1)  # [B, F_d, F]
            mask = torch.cat([seen.expand(-1, n, -1), anc], -1)
            write = (self.scratch + slots)[None].expand(b, -1)
            out = self._head(feats, level[:, fed], seq, mask, write)  # [R, F_d, dim]
            logq = self._logq(out)
        return DraftTree(tokens=tokens, depth=at.depth.expand(b, -1), parent=at.parent.expand(b, -1),
                         rank=at.ranks.expand(b, -1), score=torch.zeros(b, tree.nodes, device=device),
                         children=at.children.expand(b, -1, -1), ancestry=at.ancestry.expand(b, -1, -1), q=q)

    def _draw(self, dist: Tensor, width: int) -> Tensor:
        """`width` codes per parent without replacement, in draw order: dist [B, P, V] -> [B, P, c].
        top_k uniforms per parent are drawn whatever c (a fixed count per round). A parent whose q
        runs out of codes gets code V - 1 for the rest; those children have q = 0 and are skipped."""
        assert self.streams is not None
        b, n = dist.shape[:2]
        u = self.streams.draw((n, self.tree.top_k)).to(dist.device)  # [B, P, K]
        rest, kids = dist, []
        for j in range(width):
            x = inverse_cdf(rest, u[..., j])  # [B, P]
            kids.append(x)
            rest = rest.scatter(-1, x[..., None], 0.0)
        return torch.stack(kids, -1)
