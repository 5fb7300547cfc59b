"""SJD-PAC's Proactive Drafting (Kang et al., CVPR 2026): a shallow K-ary draft tree below the last
committed token (the token just resampled after a rejection, or the bonus), verified in the same
target forward as the Jacobi window, with tree attention on the static cache.

Block of one verification, per row with frontier n (root = position n - 1, the last committed token):

    index 0           the root (re-fed, written to its own slot, as in SJD);
    indices 1..L      the Jacobi chain: draft offset o at index 1 + o, depth o + 1, its own slot;
    indices L+1..L+m  the tree's other nodes, scratch slots S .. S + m - 1 after the sequence's S.

Tree: every node of depth d < D (tree_depth D counts the root, as SJD-PAC's code does) has K
children at depth d + 1 < D whose tokens are the level's K candidates c_{d+1,0..K-1}, the same
under every parent; c_{d,0} is the chain's draft at offset d - 1 (so the chain is the tree's rank-0
path) and c_{d,1..K-1} are drawn without replacement from that draft's q, after it (Gumbel-top-k of
log q with c_{d,0} left out: successive sampling in rank order). Below depth D - 1 only the chain
goes on. A node at depth d sits at position n - 1 + d and attends to the sequence up to its deepest
chain ancestor and to its own ancestors among the tree nodes (m = K + ... + K^(D-1) - (D - 1)).

Acceptance (`accept_tree` with `SiblingsWithoutReplacement`): at the visited node the children are
tried in rank order by recursive rejection sampling without replacement (Jeon et al. 2024): child j
is accepted with min(1, p_j(c_j) / q_j(c_j)), q_j = q without c_0..c_{j-1} renormalised, p_0 = p,
p_{j+1} = norm(max(p_j - q_j, 0)); when all fail the token is drawn from p_K. Each child of a node
was drawn from q given its earlier siblings, independently of the node's p and of the test's
uniforms, so the committed token is distributed as p: lossless. (SJD-PAC's released sampler takes
the longest accepted root-to-leaf path instead of the first accepted sibling at each level; that
choice depends on the later levels' tests, which makes the kept token's law depend on them, so this
module follows the sequential rule its paper states.)

The accepted path's tree nodes move from their scratch slots to their positions' slots
(`move_cache`, as EAGLE-2's tree decoding does). The chain's p and samples then feed the Jacobi
source's next window as in SJD (coupled by `coupling: maximal`, SJD-PAC's Adaptive Continuation,
baselines/methods/coupled_jacobi.py). Randomness per image per step: (D - 1) x V uniforms for the
candidates, L x K for the tests, 1 for the committed token and L + 1 for the chain's samples,
whatever the batch.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from baselines.framework.acceptance import ExactRule, TreeVerdict, _normalise, accept_tree
from baselines.framework.canvas import Canvas, Context, span
from baselines.framework.drafts import Draft, DraftRun, DraftSource, JacobiDraft, Outcome, scheduled
from baselines.framework.recorder import StatsRecorder
from baselines.framework.scope import RasterScope, RejectionScope, Resolution, _unmarked
from baselines.framework.speculative import SpeculativeDecoder
from baselines.methods.tree_fit import tree_misfit
from harness.api import ConfigValueError, ModelBundle, SamplingParams, checked_number
from harness.runtime.sampling import inverse_cdf, probs, sample_from


@dataclass(frozen=True)
class TreeLayout:
    """The static block layout (module docstring) for width K, depth D (root included) and L chain
    drafts; n = 1 + L + m block nodes, m tree nodes off the chain.

    depth     [n-1]     depth of nodes 1..n-1 (chain index i: i; tree nodes: 1..D-1)
    rank      [m]       a tree node's rank among its siblings (its candidate column)
    children  [n, K]    block index of each node's child of each rank, -1 = none
    attach    [m]       depth of a tree node's deepest chain ancestor (0 = the root)
    ancestry  [m, m]    ancestry[i, j]: tree node j is tree node i or one of its ancestors
    """

    depth: Tensor
    rank: Tensor
    children: Tensor
    attach: Tensor
    ancestry: Tensor

    @property
    def extra(self) -> int:
        return int(self.rank.shape[0])


@functools.lru_cache(maxsize=16)
def tree_layout(width: int, depth: int, length: int, device: torch.device) -> TreeLayout:
    """The layout of a (width, depth) tree over a chain of `length` drafts, made once and shared."""
    n_chain = 1 + length
    paths: list[tuple[int, ...]] = []  # tree nodes off the chain, by their rank path from the root
    frontier: list[tuple[int, ...]] = [()]
    for _ in range(depth - 1):
        frontier = [p + (r,) for p in frontier for r in range(width)]
        paths += [p for p in frontier if any(p)]
    index = {p: n_chain + j for j, p in enumerate(paths)}
    for d in range(depth):
        index[(0,) * d] = d  # the chain's nodes down to depth D - 1
    children = torch.full((n_chain + len(paths), width), -1, dtype=torch.long)
    for d in range(length):  # the chain: rank 0 all the way
        children[d, 0] = d + 1
    for p in paths + [(0,) * d for d in range(depth - 1)]:
        if len(p) + 1 < depth:
            for r in range(width):
                children[index[p], r] = index[p + (r,)]
    attach = torch.tensor([next((i for i, r in enumerate(p) if r), len(p)) for p in paths], dtype=torch.long)
    ancestry = torch.tensor([[len(q) <= len(p) and p[:len(q)] == q for q in paths] for p in paths],
                            dtype=torch.bool).reshape(len(paths), len(paths))
    depths = torch.tensor(list(range(1, n_chain)) + [len(p) for p in paths], dtype=torch.long)
    rank = torch.tensor([p[-1] for p in paths], dtype=torch.long)
    return TreeLayout(depth=depths.to(device), rank=rank.to(device), children=children.to(device),
                      attach=attach.to(device), ancestry=ancestry.to(device))


class SiblingsWithoutReplacement(ExactRule):
    """Recursive rejection sampling without replacement over each node's children (module
    docstring); `q` [B, n, V] (set before each walk) is the distribution each node's children were
    drawn from, without replacement in rank order."""

    name = "exact_without_replacement"

    def __init__(self) -> None:
        self.q: Tensor | None = None

    def siblings(self, dist: Tensor, xs: Tensor, valid: Tensor, u: Tensor,
                 ctx: Context) -> tuple[Tensor, Tensor]:
        """dist [B, n, V] (each node's p), xs / valid / u [B, n, K] -> (accepted rank [B, n] or -1,
        p_K where none was accepted [B, n, V])."""
        if self.q is None:
            raise RuntimeError("SiblingsWithoutReplacement.q is not set")
        p, q = dist, self.q
        taken = torch.full(xs.shape[:-1], -1, dtype=torch.long, device=xs.device)
        for j in range(xs.shape[-1]):
            x = xs[..., j:j + 1]
            live = valid[..., j] & (taken < 0)
            px, qx = p.gather(-1, x)[..., 0], q.gather(-1, x)[..., 0]
            take = live & (u[..., j] * qx < px)  # u < p_j / q_j without dividing (q_j(x) > 0 if drawn)
            miss = (live & ~take)[..., None]
            p = torch.where(miss, _normalise((p - q).clamp_min(0.0), p), p)  # p_{j+1}
            q = torch.where(miss, _normalise(q.scatter(-1, x, 0.0), q), q)  # q without c_j
            taken = torch.where(take, j, taken)
        return taken, p


class ProactiveDecoder(SpeculativeDecoder):
    """SJD with SJD-PAC's Proactive Drafting: a Jacobi source, the exact rule over the tree (module
    docstring), the raster scope.

    Args:
        sampling: how logits become p.
        draft: a Jacobi source (`jacobi` or `coupled_jacobi`; SJD-PAC: coupling maximal, window 64).
        accept: ExactRule (the tree's children are decided without replacement, see above).
        scope: RasterScope (default).
        tree_width: K, candidates per tree level (>= 1; 1 = SJD with its chain only).
        tree_depth: D, tree levels counting the root (>= 1; D - 1 <= window).
        name: decoder label.
    """

    def __init__(self, sampling: SamplingParams, draft: DraftSource, accept: ExactRule,
                 scope: RejectionScope | None = None, tree_width: int = 3, tree_depth: int = 3,
                 name: str | None = None) -> None:
        checked_number("decoder tree_width", tree_width, integer=True, low=1)
        checked_number("decoder tree_depth", tree_depth, integer=True, low=1)
        if not isinstance(draft, JacobiDraft):
            raise ConfigValueError(f"decoder draft must be a Jacobi source (jacobi or coupled_jacobi) for the "
                                   f"proactive tree, got {getattr(draft, 'name', draft)!r}")
        if not isinstance(accept, ExactRule):
            raise ConfigValueError(f"decoder accept must be the exact rule for the proactive tree, got "
                                   f"{getattr(accept, 'name', accept)!r}")
        if scope is not None and type(scope) is not RasterScope:
            raise ConfigValueError(f"decoder scope must be raster for the proactive tree, got {scope.name!r}")
        if tree_depth - 1 > draft.length:
            raise ConfigValueError(f"decoder tree_depth ({tree_depth}) must be at most draft.window + 1 "
                                   f"({draft.length + 1}): the tree's rank-0 path is the window's chain")
        super().__init__(sampling, draft, accept, RasterScope(), name=name or "sjd_pac")
        self.tree_width, self.tree_depth = int(tree_width), int(tree_depth)
        self.rule = SiblingsWithoutReplacement()

    @property
    def cache_scratch(self) -> int:  # type: ignore[override]
        """Scratch cache slots: one per tree node off the chain (harness/runtime/engine.reserve)."""
        k, d = self.tree_width, self.tree_depth
        return sum(k ** i for i in range(1, d)) - (d - 1)

    def misfit(self, models: ModelBundle, rows: int, memory: int) -> tuple[str, str] | None:
        """(option, why) when the tree cannot fit these models, checked before anything is bound or
        generated (harness/run.py): K distinct candidates per level need K <= the image codes, and
        the tree's nodes (sum of K^i for i < D, less the chain: scratch cache slots) each carry a
        distribution over the codes in a verification of `rows` rows, which must fit in `memory`
        bytes (float32 probabilities alone: a lower bound of what the tree needs)."""
        return tree_misfit(models, rows, memory, width=self.tree_width, width_option="tree_width",
                           slots=self.cache_scratch, size_option="tree_depth",
                           size_hint=f"make the tree smaller (tree_width {self.tree_width}, tree_depth "
                                     f"{self.tree_depth}: its nodes grow as tree_width^(tree_depth - 1))")

    def _bound(self, models: ModelBundle):
        draft, scope = super()._bound(models)
        if self.cache_scratch and not hasattr(models.target, "move_cache"):
            raise ConfigValueError(f"model {models.name!r}: its target ({type(models.target).__name__}) has no "
                                   "`move_cache`; the proactive tree needs scratch cache slots (set "
                                   "decoder.sjd_pac.tree_width=1 to run without it)")
        return draft, scope

    def _step(self, ctx: Context, canvas: Canvas, active: Tensor, run: DraftRun, rec: StatsRecorder,
              scope: RejectionScope, verified: Tensor | None) -> Tensor | None:
        """One verification of the window and the tree (module docstring)."""
        start = canvas.frontier  # n [B]
        remaining = ctx.n_tokens - start
        draft = run.propose(canvas)
        length = draft.tokens.shape[1]
        layout = tree_layout(self.tree_width, self.tree_depth, length, ctx.device)
        canvas.write(start[:, None] + span(length, ctx.device), draft.tokens)
        cand, cand_ok = self._candidates(ctx, draft)  # [B, D-1, K]
        block, p = self._verify_tree(ctx, canvas, draft, layout, cand)  # [B, n], [B, n, V]
        b, n = block.shape
        # each node's children are drawn from the chain's q at the children's offset (node depth)
        node_depth = torch.cat([torch.zeros(1, dtype=torch.long, device=ctx.device), layout.depth])
        self.rule.q = draft.q[:, node_depth.clamp(max=length - 1)]  # [B, n, V]
        children = layout.children.expand(b, -1, -1).clone()
        if layout.extra:  # a candidate q could not draw (q had too few tokens) is no child
            ok = torch.ones(b, n, self.tree_width, dtype=torch.bool, device=ctx.device)
            level = node_depth.clamp(max=self.tree_depth - 2)  # candidates of level depth + 1
            ok[:, node_depth < self.tree_depth - 1] = cand_ok[:, level[node_depth < self.tree_depth - 1]]
            children = children.masked_fill(~ok, -1)
        u = ctx.streams.draw((length, self.tree_width))
        room = scheduled(self.draft, start, length, ctx.n_tokens)  # the single-token head and tail
        limit = remaining if room is None else torch.minimum(room, remaining)
        verdict = self._walk(p, children, block, layout.depth.expand(b, -1), u, limit, ctx)
        self.rule.q = None
        a = verdict.accepted  # [B]
        final = inverse_cdf(verdict.dist, ctx.streams.draw((1,))[:, 0])  # the token after the path
        samples = sample_from(p[:, :length + 1], ctx.streams)  # the chain's guesses (Jacobi source)
        # commit: the path's tokens and the final one; the path's tree nodes move to their slots
        offsets = span(length, ctx.device)
        on_path = offsets < a[:, None]
        path_tokens = block.gather(1, verdict.path)
        canvas.write(start[:, None] + offsets, torch.where(on_path, path_tokens, draft.tokens))
        canvas.write(start[:, None] + a[:, None], final[:, None])
        seq = int(ctx.models.target.cache_len)
        prefix = seq - ctx.n_tokens
        moving = on_path & (verdict.path > length)
        if layout.extra:
            ctx.models.target.move_cache(torch.where(moving, seq + verdict.path - length - 1, seq - 1),
                                         torch.where(moving, prefix + start[:, None] + offsets, seq - 1))
        advance = torch.minimum(a + 1, remaining)
        valid = offsets < remaining[:, None]
        res = Resolution(keep=on_path, rejected=(offsets == a[:, None]) & verdict.rejected[:, None] & valid,
                         first=a, resample=_unmarked(on_path.shape, on_path.device), advance=advance,
                         kv_valid=a)
        canvas.fed = torch.where(active, start + a, canvas.fed)
        canvas.frontier = torch.where(active, start + advance, start)
        run.observe(canvas, Outcome(start=start, p=p[:, :length + 1], samples=samples, res=res))
        self._record(rec, active, start, draft, res, 0)
        # verifications whose accepted path left the chain through a tree node (a result column)
        ctx.count("tree_paths", torch.where(active, (moving.sum(-1) > 0).float(), 0.0))
        return None

    def _walk(self, p: Tensor, children: Tensor, block: Tensor, depth: Tensor, u: Tensor, limit: Tensor,
              ctx: Context) -> TreeVerdict:
        """The accepted path: `accept_tree` with `self.rule` (its q set): p [B, n, V], children
        [B, n, K], block [B, n], depth [B, n-1], u [B, L, K], limit [B]."""
        return accept_tree(p, children, block, depth, u, limit, self.rule, ctx)

    def _candidates(self, ctx: Context, draft: Draft) -> tuple[Tensor, Tensor]:
        """The K candidates of tree levels 1..D-1 [B, D-1, K] and whether each could be drawn: rank
        0 is the chain's draft, ranks 1..K-1 successive samples without replacement from its q
        (Gumbel-top-(K-1) of log q with the draft left out)."""
        levels = self.tree_depth - 1
        first = draft.tokens[:, :levels]  # [B, D-1]
        if self.tree_width == 1 or levels == 0:
            return first[..., None], torch.ones_like(first[..., None], dtype=torch.bool)
        q = draft.q[:, :levels].scatter(-1, first[..., None], 0.0)  # [B, D-1, V]
        g = -torch.log(-torch.log(ctx.streams.draw((levels, ctx.vocab)).clamp(1e-7, 1 - 1e-7)))
        score = torch.where(q > 0, q.log() + g, float("-inf"))
        top = score.topk(self.tree_width - 1, dim=-1)
        cand = torch.cat([first[..., None], top.indices], -1)
        ok = torch.cat([torch.ones_like(first[..., None], dtype=torch.bool), top.values > float("-inf")], -1)
        return cand, ok

    def _verify_tree(self, ctx: Context, canvas: Canvas, draft: Draft, layout: TreeLayout,
                     cand: Tensor) -> tuple[Tensor, Tensor]:
        """One target forward over the root, the chain and the tree nodes -> (block tokens [B, n],
        p [B, n, V]: the target's distribution after each block node)."""
        target = ctx.models.target
        length = draft.tokens.shape[1]
        b = draft.tokens.shape[0]
        tokens, slots = canvas.read(canvas.fed, length + 1)  # root + chain (fed = frontier - 1)
        seq = int(target.cache_len)
        prefix = seq - ctx.n_tokens
        m = layout.extra
        extra_depth = layout.depth[length:]  # [m]
        extra_tokens = cand[:, (extra_depth - 1).clamp_min(0), layout.rank] if m else tokens[:, :0]
        block = torch.cat([tokens, extra_tokens], 1)  # [B, n]
        root = canvas.fed  # position n - 1
        extra_pos = (root[:, None] + extra_depth).clamp(max=ctx.n_tokens - 1)
        positions = torch.cat([slots, extra_pos], 1)  # [B, n]
        write = torch.cat([prefix + slots, seq + span(m, ctx.device).expand(b, -1)], 1)
        key = span(seq + m, ctx.device)
        chain_mask = key[None, None] <= (prefix + slots)[..., None]  # slot-causal over the sequence
        attach = (prefix + root[:, None] + layout.attach).clamp(max=seq - 1)  # [B, m]
        tree_mask = key[None, None] <= attach[..., None]
        tree_mask = torch.cat([tree_mask[..., :seq], layout.ancestry.expand(b, -1, -1)], -1)
        mask = torch.cat([chain_mask, tree_mask], 1)  # [B, n, S + m]
        logits = target.forward(block, positions, mask, slots=write)
        return block, probs(logits, ctx.sampling)
