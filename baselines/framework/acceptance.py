"""Acceptance rules: given the target's p and the drafts, decide which drafts are accepted and from
which distribution a rejected position is resampled. Vectorised over batch and draft positions;
randomness comes in as uniforms drawn from the per-image random streams by the loop.

A rule sees, for one verification of L drafts:
    p       [B, L, V]  target distribution at each draft position (CFG -> temperature -> the top-k
                       and top-p filters in `sampling.filter_order`, harness/runtime/sampling.py),
                       conditioned on the drafts before it;
    q       [B, L, V]  the distribution each draft was drawn from, or None for drafts that are a
                       deterministic function of earlier randomness (q = one-hot on the draft);
    drafts  [B, L]     int64;
    u       [B, L]     uniforms in [0, 1), one per position.
and returns a `Verdict`: accept [B, L] bool and residual [B, L, V] (normalised). Decisions after
the first rejection are computed too; the rejection scope decides which ones count.

Rules: `exact` (speculative sampling; lossless) and `lantern` (LANTERN's latent-proximity
relaxation). MuLo-SD's `pooled_threshold` plugs in the same way: accept = pooled p >= tau (no q,
no uniforms), residual = p.

Over a draft tree (EAGLE-2, LANTERN; baselines/methods/tree_decoding.py) the same two rules decide one
candidate at a time (`candidate`): `accept_tree` walks the tree from the root, tries the children
of the current node in the drafter's rank order, accepts child x with the rule's probability (the
tree's drafts are a deterministic top-k, q = 1), otherwise replaces p by the rule's distribution
after rejecting x and tries the next sibling; when every child fails (or a leaf is reached) the
token is drawn from what remains. With `exact` this is sampling without replacement: lossless.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from baselines.framework.canvas import NEIGHBOUR_METRICS, Context, span
from harness.api import ConfigValueError
from harness.runtime.hostsync import width


@dataclass(frozen=True)
class Verdict:
    """accept [B, L] bool; residual [B, L, V]: where a rejected position is resampled from;
    score [B, L] or None: for a threshold rule, the value compared with its threshold, so that
    accept = score >= tau for every tau in [0, 1] (MuLo-SD's one-pass tau curve,
    baselines/framework/redraw.py); None where acceptance is not such a threshold."""

    accept: Tensor
    residual: Tensor
    score: Tensor | None = None


class AcceptanceRule(Protocol):
    """What SpeculativeDecoder asks of a rule. A rule that reads the block's layout (e.g. which
    draft lies one row below another) may also define `check_layout(draft, scope)`: the decoder
    calls it once per generate with the bound DraftSource and RejectionScope, and it raises
    ValueError naming the keys when the rule cannot read their blocks (PooledThresholdRule's
    `below`)."""

    name: str

    def decide(self, p: Tensor, q: Tensor | None, drafts: Tensor, u: Tensor, ctx: Context) -> Verdict:
        """p [B, L, V], q [B, L, V] or None, drafts [B, L], u [B, L] -> Verdict."""
        ...


def _at(dist: Tensor, x: Tensor) -> Tensor:
    """dist [B, L, V], tokens as a column x [B, L, 1] -> dist[b, l, x[b, l]] [B, L]."""
    return dist.gather(-1, x)[..., 0]


def _normalise(mass: Tensor, fallback: Tensor) -> Tensor:
    """mass [..., V] >= 0 -> mass / sum; rows without mass take `fallback` (they only arise where
    the acceptance probability is 1, so they are never sampled)."""
    total = mass.sum(-1, keepdim=True)
    return (mass / total.clamp_min(1e-30)).where(total > 0, fallback)


def speculative_verdict(p: Tensor, q: Tensor | None, drafts: Tensor, u: Tensor) -> Verdict:
    """Speculative sampling (Leviathan et al.; Chen et al.): accept draft x with probability
    min(1, p(x) / q(x)); on rejection resample from normalise(max(p - q, 0)). The output token is
    then distributed exactly as p whenever x ~ q."""
    x = drafts[..., None]  # [B, L, 1]
    px = _at(p, x)
    if q is None:  # q = one-hot(x): accept with probability p(x), residual = p without x
        accept = u < px
        residual = p.scatter(-1, x, 0.0)
    else:
        accept = u * _at(q, x) < px  # u < p/q without dividing (q(x) > 0 for a drawn x)
        residual = (p - q).clamp_min(0.0)
    return Verdict(accept=accept, residual=_normalise(residual, p))


class ExactRule:
    """`exact`: lossless speculative sampling (SJD, draft-model SD; EAGLE-2's multi-candidate
    acceptance over a draft tree, `candidate`)."""

    name = "exact"

    def decide(self, p: Tensor, q: Tensor | None, drafts: Tensor, u: Tensor, ctx: Context) -> Verdict:
        return speculative_verdict(p, q, drafts, u)

    def candidate(self, dist: Tensor, x: Tensor, ctx: Context) -> tuple[Tensor, Tensor]:
        """One tree candidate: dist [B, V] (p, or what is left of it after rejected siblings), x [B]
        -> (accept probability p(x) [B], the distribution after rejecting x: dist without x,
        renormalised [B, V])."""
        px = dist.gather(-1, x[:, None])[:, 0]
        return px, _normalise(dist.scatter(-1, x[:, None], 0.0), dist)

    def siblings(self, dist: Tensor, xs: Tensor, valid: Tensor, u: Tensor,
                 ctx: Context) -> tuple[Tensor, Tensor]:
        """All children of a node at once (`candidate` one after the other, in closed form): sibling
        j (distinct tokens) is accepted when the earlier ones were not and u_j < p(x_j) / (1 - the
        mass of the earlier ones). dist [..., V], xs / valid / u [..., K] (any leading dims, e.g. every
        node of a tree) -> (accepted sibling [...] or -1, dist without every valid child, renormalised
        [..., V])."""
        px = dist.gather(-1, xs) * valid
        before = px.cumsum(-1) - px
        ratio = torch.where(px > 0, px / (1.0 - before).clamp_min(1e-30), torch.zeros_like(px))
        hit = valid & (u < ratio)
        taken = torch.where(hit.any(-1), hit.long().argmax(-1), -1)
        removed = torch.zeros_like(dist).scatter_add(-1, xs, px)
        return taken, _normalise((dist - removed).clamp_min(0.0), dist)


def lantern_boost(p: Tensor, drafts: Tensor, neighbours: Tensor, delta: float) -> Tensor:
    """LANTERN's latent-proximity aware distribution, one per draft position.

    For draft x with neighbours n_1, n_2, ... (nearest first in the tokenizer's latent space), keep
    the longest prefix A = {n_1..n_m} whose cumulative target mass is <= delta and move that mass
    onto x: p~(x) = p(x) + p(A), p~(a) = 0 for a in A, p~ = p elsewhere. Moving mass m changes p by
    exactly m in total variation, so TVD(p, p~) <= delta.

    Args:
        p: [B, L, V] target distributions; drafts: [B, L]; neighbours: [V, k] int64 table of each
            code's nearest other codes (baselines/framework/neighbours.py).
    Returns:
        p~ [B, L, V]; equal to p, bit for bit, when delta = 0.
    """
    near = neighbours[drafts]  # [B, L, k]
    near_p = p.gather(-1, near)  # [B, L, k]
    cum = near_p.cumsum(-1)
    kept = cum <= delta  # a prefix A, since cum is non-decreasing
    moved = cum.where(kept, 0.0).amax(-1, keepdim=True)  # p(A) [B, L, 1]: cum at A's end, 0 if A is empty
    boosted = p.scatter(-1, near, near_p.masked_fill(kept, 0.0))
    return boosted.scatter_add_(-1, drafts[..., None], moved)  # x is not its own neighbour: p(x) + p(A)


class LanternRule:
    """`lantern` (LANTERN, Jang et al., ICLR 2025, §3.5 of decoding_anchors.md): speculative
    sampling against LANTERN's p~ (see `lantern_boost`): accept with min(1, p~(x) / q(x)); on
    rejection resample from normalise(max(p~ - q, 0)), which leaves out x and the neighbours whose
    mass x absorbed (with LANTERN's one-hot tree drafts this is its "zero x and its neighbours,
    renormalise"). Not lossless: each position's distribution moves by at most delta in TVD.
    With sampled chain drafts q is the drafter's distribution, as in LANTERN++'s static trees
    (LANTERN's EAGLE-2 top-k tree uses q = 1); with q = None the ratio is p~(x).

    Over a draft tree (`candidate`, the sampling branch of LANTERN's evaluate_posterior): accept x
    with probability p(x) + p(A) (A: x's pooled neighbours, computed on what is left of p after
    rejected siblings); on rejection zero x and, when x counts as pooled, its k + 1 nearest codes
    (`on_reject: neighbourhood`, LANTERN's code) or only the pooled ones (`pooled`), and
    renormalise; a distribution with no mass left becomes uniform over the codebook (LANTERN's
    fallback). x counts as pooled when A is not empty (`pooled_if: prefix`, LANTERN's code: the
    first neighbour's mass is <= delta, also when it is 0, as it is for every code top-k filtered
    out) or only when A moved mass > 0 (`pooled_if: mass`: then delta = 0 is `exact`).

    Greedy (temperature 0) over a draft tree (`greedy_boost`, `accept_tree_greedy`: LANTERN's
    greedy branch): p is the softmax of the CFG-mixed logits, x's entry is raised to p(x) + p(A),
    and x is accepted iff it is the argmax of that distribution; the accepted path is the longest
    accepted root-to-leaf prefix. The chain decoder (`decide`) uses one-hot p in greedy mode.

    Args:
        k: latent neighbours considered per draft token (the paper's comparison: 1000; clamped
            to V - 1).
        delta: total-variation budget in [0, 1] (the paper's comparison: 0.4; 0 = `exact` with
            `pooled_if: mass`).
        metric: how neighbours are found (NEIGHBOUR_METRICS): "raw" (L2 between the tokenizer's
            stored code vectors: LANTERN's generate_codebook.py) or "normalised" (L2 between the
            l2-normalised codes the VQ quantiser matches).
        on_reject: tree candidates only: "neighbourhood" or "pooled" (above).
        pooled_if: tree candidates only: "prefix" or "mass" (above).
    """

    name = "lantern"
    ON_REJECT = ("neighbourhood", "pooled")
    POOLED_IF = ("prefix", "mass")

    def __init__(self, k: int = 1000, delta: float = 0.4, metric: str = "raw",
                 on_reject: str = "neighbourhood", pooled_if: str = "prefix") -> None:
        if int(k) != k or k < 1:
            raise ValueError(f"decoder.lantern accept.k must be an integer >= 1, got {k!r}")
        if not 0.0 <= delta <= 1.0:
            raise ValueError(f"decoder.lantern accept.delta must be a TVD budget in [0, 1], got {delta!r} "
                             "(LANTERN++'s relative lambda form is not implemented)")
        if metric not in NEIGHBOUR_METRICS:
            raise ValueError(f"decoder.lantern accept.metric must be one of {NEIGHBOUR_METRICS}, "
                             f"got {metric!r}")
        if on_reject not in self.ON_REJECT:
            raise ValueError(f"decoder.lantern accept.on_reject must be one of {self.ON_REJECT}, "
                             f"got {on_reject!r}")
        if pooled_if not in self.POOLED_IF:
            raise ValueError(f"decoder.lantern accept.pooled_if must be one of {self.POOLED_IF}, "
                             f"got {pooled_if!r}")
        self.k = int(k)
        self.delta = float(delta)
        self.metric = metric
        self.on_reject = on_reject
        self.pooled_if = pooled_if

    def decide(self, p: Tensor, q: Tensor | None, drafts: Tensor, u: Tensor, ctx: Context) -> Verdict:
        boosted = lantern_boost(p, drafts, ctx.neighbours(self.k, self.metric), self.delta)
        return speculative_verdict(boosted, q, drafts, u)

    def _prefix(self, dist: Tensor, x: Tensor, ctx: Context) -> tuple[Tensor, Tensor, Tensor]:
        """dist [..., V], x [...] -> (x's k + 1 nearest codes [..., k + 1], nearest first; m, the
        length of the pooled prefix A of the first k [...]; p(A) [...], 0 when A is empty)."""
        zone = ctx.neighbours(self.k + 1, self.metric)[x]  # one table for both uses
        cum = dist.gather(-1, zone[..., :self.k]).cumsum(-1)
        count = (cum <= self._budget(dist, x)).sum(-1)  # a prefix, since cum is non-decreasing
        moved = cum.gather(-1, (count - 1).clamp_min(0)[..., None])[..., 0].where(count > 0, 0.0)
        return zone, count, moved

    def _budget(self, dist: Tensor, x: Tensor) -> Tensor | float:
        """The mass the pooled prefix may hold: delta (LANTERN++'s relative form, lambda, overrides
        this: baselines/methods/lantern_pp.py); a float, or a tensor [..., 1] per candidate."""
        return self.delta

    def candidate(self, dist: Tensor, x: Tensor, ctx: Context) -> tuple[Tensor, Tensor]:
        """One tree candidate (see the class docstring): dist [B, V], x [B] -> (accept probability
        p(x) + p(A) [B], the distribution after rejecting x [B, V])."""
        zone, count, moved = self._prefix(dist, x, ctx)
        pooled = count > 0 if self.pooled_if == "prefix" else moved > 0
        prob = dist.gather(-1, x[:, None])[:, 0] + moved
        if self.on_reject == "neighbourhood":  # LANTERN zeroes nearest_latents[x, :k+1]
            drop = torch.ones_like(zone, dtype=torch.bool)
        else:
            zone = zone[:, :self.k]
            drop = torch.arange(zone.shape[1], device=zone.device)[None] < count[:, None]
        drop = drop & pooled[:, None]
        after = dist.scatter(-1, x[:, None], 0.0)
        after = after.scatter(-1, zone, after.gather(-1, zone).masked_fill(drop, 0.0))
        uniform = torch.full_like(dist, 1.0 / dist.shape[-1])
        return prob, _normalise(after, uniform)

    def greedy_boost(self, p: Tensor, xs: Tensor, ctx: Context) -> Tensor:
        """LANTERN's greedy test: p [..., V] (softmax of the CFG-mixed logits), xs [..., K] ->
        [..., K] bool: x is the argmax of p with p(x) raised to p(x) + p(A) (the neighbours keep
        their mass). Ties go to the lower code, as torch.argmax does: x wins against every code
        before it strictly and against every code after it or equal."""
        _, _, moved = self._prefix(p[..., None, :].expand(*xs.shape, p.shape[-1]), xs, ctx)
        boosted = p.gather(-1, xs) + moved
        return _is_argmax(p, xs, boosted)


def _is_argmax(p: Tensor, xs: Tensor, value: Tensor) -> Tensor:
    """p [..., V], xs [..., K], value [..., K] -> whether argmax(p with p[x] := value) == x."""
    before = p.cummax(-1).values  # max of p[:i + 1]
    before = torch.cat([torch.full_like(before[..., :1], float("-inf")), before[..., :-1]], -1)
    after = p.flip(-1).cummax(-1).values.flip(-1)  # max of p[i:]
    after = torch.cat([after[..., 1:], torch.full_like(after[..., :1], float("-inf"))], -1)
    return (value > before.gather(-1, xs)) & (value >= after.gather(-1, xs))


@dataclass(frozen=True)
class TreeVerdict:
    """The walk over one draft tree per row: path [B, L] (block indices of the accepted nodes level
    by level, 0 past `accepted`), accepted [B], dist [B, V] (where the token after the path is drawn
    from: what was left after rejections, or the target's p at the last accepted node) and
    rejected [B] bool (the walk stopped at a level whose candidates were all rejected)."""

    path: Tensor
    accepted: Tensor
    dist: Tensor
    rejected: Tensor


class TreeRule(Protocol):
    name: str

    def candidate(self, dist: Tensor, x: Tensor, ctx: Context) -> tuple[Tensor, Tensor]: ...


def sequential_siblings(rule: TreeRule, dist: Tensor, xs: Tensor, valid: Tensor, u: Tensor,
                        ctx: Context) -> tuple[Tensor, Tensor]:
    """One node's children tried one after the other with `rule.candidate`: dist [B, V], xs [B, K]
    the children's tokens in rank order, valid [B, K], u [B, K] -> (the accepted sibling [B], -1
    for none; the distribution after the rejections [B, V], meaningful where none was accepted)."""
    taken = torch.full(xs.shape[:1], -1, dtype=torch.long, device=xs.device)
    for j in range(xs.shape[1]):
        prob, after = rule.candidate(dist, xs[:, j], ctx)
        live = valid[:, j] & (taken < 0)
        take = live & (u[:, j] < prob)
        dist = torch.where((live & ~take)[:, None], after, dist)
        taken = torch.where(take, j, taken)
    return taken, dist


def accept_tree(p: Tensor, children: Tensor, tokens: Tensor, depth: Tensor, u: Tensor, limit: Tensor,
                rule: TreeRule, ctx: Context, q: Tensor | None = None) -> TreeVerdict:
    """Multi-candidate acceptance over a draft tree (module docstring), vectorised over rows.

    The walk visits one node per level, and what happens at a node depends only on that node: its p
    (the target already conditioned on the node's ancestry), its children and the uniforms of its
    level. So the children of every node are decided at once — by the rule's `siblings` in closed
    form (ExactRule) or one candidate after the other with `candidate` (`sequential_siblings`) —
    and the walk then only follows the accepted child from the root, level by level.

    Args:
        p: [B, 1+m, V] the target's distribution after each block node (0 = the root).
        children: [B, 1+m, K] block indices of each node's children in rank order, -1 = none.
        tokens: [B, 1+m] the block's tokens.
        depth: [B, m] the depth of nodes 1..m (1 = the root's children); node d's children are
            decided with the uniforms of level d.
        u: [B, L, K] uniforms: one per (level, sibling), drawn whether used or not.
        limit: [B] most tokens a row may accept (positions left in its image).
        rule: decides the candidates (`siblings` or `candidate`).
        q: [B, 1+m, V] the distribution each node's children were drawn from (without replacement,
            in rank order: LANTERN++'s static trees, baselines/methods/static_tree.py), or None for
            deterministic drafts (q = 1). With q the rule decides with `drafted_siblings`.
    """
    b, levels, k = u.shape
    n = p.shape[1]
    if children.numel():  # the widest sibling set: read on the CPU, all K columns elsewhere
        children = children[..., :max(width((children >= 0).sum(-1).max(), children.shape[-1]), 1)]
    kk = children.shape[-1]
    level = torch.cat([torch.zeros_like(depth[:, :1]), depth], 1)  # [B, 1+m]
    # a node decides its children only inside the image and the drafted levels
    valid = ((level < limit[:, None]) & (level < levels))[..., None] & (children >= 0)  # [B, 1+m, K']
    xs = tokens.gather(1, children.clamp_min(0).flatten(1)).view(b, n, kk)
    uu = u.gather(1, level.clamp(max=levels - 1)[..., None].expand(-1, -1, k))[..., :kk]
    taken, after = _decide_children(rule, p, xs, valid, uu, ctx, q)  # [B, 1+m], [B, 1+m, V]
    # the walk: an accepted child leads on, any other node is where the walk stops (a fixed point)
    own = span(n, p.device).expand(b, -1)
    step = torch.where(taken >= 0, children.gather(-1, taken.clamp_min(0)[..., None])[..., 0], own)
    cur = torch.zeros(b, 1, dtype=torch.long, device=p.device)
    reached = []
    for _ in range(levels):
        cur = step.gather(1, cur)
        reached.append(cur)
    stop = cur  # [B, 1]
    accepted = level.gather(1, stop)[:, 0]  # every accepted child is one level deeper
    path = torch.cat(reached, 1).masked_fill(span(levels, p.device) >= accepted[:, None], 0)
    rejected = (valid.any(-1) & (taken < 0)).gather(1, stop)  # [B, 1]: every child of `stop` failed
    at_stop = stop[..., None].expand(-1, -1, p.shape[-1])
    dist = torch.where(rejected, after.gather(1, at_stop)[:, 0], p.gather(1, at_stop)[:, 0])
    return TreeVerdict(path=path, accepted=accepted, dist=dist, rejected=rejected[:, 0])


def _decide_children(rule: TreeRule, p: Tensor, xs: Tensor, valid: Tensor, u: Tensor,
                     ctx: Context, q: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Every node's children at once: p [B, N, V], xs / valid / u [B, N, K], q [B, N, V] or None ->
    (the accepted child's rank [B, N], -1 for none; each node's distribution after its rejections
    [B, N, V])."""
    if q is not None:
        drafted = getattr(rule, "drafted_siblings", None)
        if drafted is None:
            raise ConfigValueError(f"decoder accept {rule.name!r} treats draft-tree nodes as deterministic "
                                   "(q = 1) but this tree's nodes were sampled from the drafter: use "
                                   "baselines.methods.lantern_pp.RelativeLanternRule (lam 1 = exact)")
        b, n, v = p.shape
        taken, after = drafted(p.reshape(b * n, v), q.reshape(b * n, v), xs.flatten(0, 1), valid.flatten(0, 1),
                               u.flatten(0, 1), ctx)
        return taken.view(b, n), after.view(b, n, v)
    siblings = getattr(rule, "siblings", None)
    if siblings is not None:
        return siblings(p, xs, valid, u, ctx)
    b, n, v = p.shape
    taken, after = sequential_siblings(rule, p.reshape(b * n, v), xs.flatten(0, 1), valid.flatten(0, 1),
                                       u.flatten(0, 1), ctx)
    return taken.view(b, n), after.view(b, n, v)


class GreedyTreeRule(Protocol):
    name: str

    def greedy_boost(self, p: Tensor, xs: Tensor, ctx: Context) -> Tensor: ...


def accept_tree_greedy(p: Tensor, children: Tensor, tokens: Tensor, depth: Tensor, limit: Tensor, levels: int,
                       rule: GreedyTreeRule, ctx: Context) -> TreeVerdict:
    """LANTERN's greedy acceptance over a draft tree (evaluate_posterior without a logits
    processor), vectorised over rows.

    Every node is tested against its parent's p (`rule.greedy_boost`: is it the argmax once its
    neighbours' mass is added to it?). LANTERN scores each root-to-leaf path (its rows, leaves in
    block order) by the length of its accepted prefix and keeps the first longest one; so the
    accepted path ends at the deepest node whose whole ancestry was accepted, ties going to the one
    above the earliest leaf. Unlike the sampling walk, two accepted siblings are both followed. The
    token after the path is the argmax of p at its end (dist is one-hot there).

    Args:
        p: [B, 1+m, V] softmax of the CFG-mixed logits after each block node (0 = the root).
        children: [B, 1+m, K] block indices of each node's children, -1 = none.
        tokens: [B, 1+m] the block's tokens.
        depth: [B, m] the depth of nodes 1..m.
        limit: [B] most tokens a row may accept (positions left in its image).
        levels: the most drafted levels (depth + 1 of the draft options).
        rule: has `greedy_boost` (LanternRule).
    """
    b, n, _ = p.shape
    device = p.device
    level = torch.cat([torch.zeros_like(depth[:, :1]), depth], 1)  # [B, 1+m]
    kids = children.clamp_min(0)
    xs = tokens.gather(1, kids.flatten(1)).view(kids.shape)
    ok = rule.greedy_boost(p, xs, ctx) & (children >= 0)  # [B, 1+m, K]: child k of node i passes
    # per node: its parent and whether it passed (the root has neither)
    parent = torch.zeros(b, n, dtype=torch.long, device=device)
    passed = torch.zeros(b, n, dtype=torch.bool, device=device)
    owner = span(n, device)[None, :, None].expand_as(children)
    real = children >= 0
    flat = (kids + span(b, device)[:, None, None] * n)[real]  # each child's place in [B * (1+m)]
    parent.view(-1).scatter_(0, flat, owner[real])
    passed.view(-1).scatter_(0, flat, ok[real])
    passed &= (level <= limit[:, None]) & (level <= levels)
    passed[:, 0] = True
    chain = passed.clone()  # the node and all its ancestors passed
    for _ in range(levels):
        chain = passed & chain.gather(1, parent)
    reach = torch.where(chain, level, 0)  # depth of the deepest accepted node on the path to the root
    for _ in range(levels):
        reach = torch.where(chain, level, reach.gather(1, parent))
    leaf = ~real.any(-1)  # [B, 1+m]
    score = torch.where(leaf, reach, -1)
    best = score.argmax(1, keepdim=True)  # the first leaf of the longest accepted prefix
    accepted = score.gather(1, best)[:, 0]
    stop = best
    for _ in range(levels):  # climb from the leaf to the end of its accepted prefix
        stop = torch.where(level.gather(1, stop) > accepted[:, None], parent.gather(1, stop), stop)
    path = torch.zeros(b, levels + 1, dtype=torch.long, device=device)
    cur = stop
    for _ in range(levels):  # every node of the accepted path at its depth (column 0: the root)
        path.scatter_(1, level.gather(1, cur), cur)
        cur = parent.gather(1, cur)
    path = path[:, 1:]
    deciding = (level < limit[:, None]) & (level < levels)  # nodes whose children could be accepted
    rejected = (real & deciding[..., None]).any(-1).gather(1, stop)
    top = p.gather(1, stop[..., None].expand(-1, -1, p.shape[-1]))[:, 0].argmax(-1, keepdim=True)
    dist = torch.zeros_like(p[:, 0]).scatter_(-1, top, 1.0)
    return TreeVerdict(path=path, accepted=accepted, dist=dist, rejected=rejected[:, 0])
