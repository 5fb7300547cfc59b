"""`lantern` against LANTERN's own acceptance (github.com/jadohu/LANTERN @3a56e45,
models/ea_model_llamagen.py `evaluate_posterior`, models/drafters/utils.py
`prepare_logits_processor`): both branches compared with a plain-torch transcription of that code's
logic on hand-built trees and distributions (codes of zero mass, as top-k filtering leaves them),
the two filter orders, and a LANTERN head stored as model.safetensors."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest
import torch
from torch import Tensor

from baselines.framework.acceptance import LanternRule, accept_tree, accept_tree_greedy
from harness.api import ConfigValueError, SamplingParams
from harness.models.eagle_head import build_head, random_head
from harness.models.gpt import GPTConfig
from harness.models.hub import WeightsError
from harness.runtime.sampling import filter_logits


class _Table:
    """The one thing LanternRule reads from a decode Context: a neighbour table [V, V-1]."""

    def __init__(self, table: Tensor) -> None:
        self.table = table

    def neighbours(self, k: int, metric: str = "raw") -> Tensor:
        return self.table[:, :k]


def _table(vocab: int, rows: dict[int, list[int]], seed: int = 0) -> Tensor:
    """[V, V-1]: the given rows first (nearest first), the other codes after them in a seeded order."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for code in range(vocab):
        given = rows.get(code, [])
        rest = [c for c in torch.randperm(vocab, generator=g).tolist() if c != code and c not in given]
        out.append(given + rest)
    return torch.tensor(out)


# ----------------------------------------------------------------------------- the transcription
def _rows(children: Tensor) -> list[list[int]]:
    """LANTERN's retrieve_indices for one tree: children [1+m, K] -> the root-to-leaf paths of block
    indices, padded with -1, leaves in block order (its greedy order)."""
    n = children.shape[0]
    parent = {int(c): i for i in range(n) for c in children[i].tolist() if c >= 0}
    paths = []
    for node in range(n):
        if (children[node] >= 0).any():
            continue
        path = [node]
        while path[-1] != 0:
            path.append(parent[path[-1]])
        paths.append(path[::-1])
    width = max(len(p) for p in paths)
    return [p + [-1] * (width - len(p)) for p in paths]


def _sorted_rows(rows: list[list[int]]) -> list[list[int]]:
    """The sampling branch's order: rows sorted lexicographically, -1 after every node."""
    return sorted(rows, key=lambda r: [x if x >= 0 else 10**9 for x in r])


Outcome = tuple[int, list[int], Tensor]  # accepted drafts, their tokens, where the next token is drawn from


def lantern_sampling_transcribed(p: Tensor, children: Tensor, tokens: Tensor, nearest: Tensor, k: int,
                                 delta: float, draw: Callable[[int, int], float]) -> Outcome:
    """evaluate_posterior's sampling branch with lantern=True, step by step, on one tree: p [1+m, V]
    the (already processed) target distribution after each block node, tokens [1+m], nearest [V, *].
    `draw(level, node)` replaces random.random() for the candidate `node` at `level`.
    Returns (accepted drafts, their tokens, sample_p)."""
    rows = _sorted_rows(_rows(children))
    candidates = torch.tensor([[int(tokens[x]) if x >= 0 else -1 for x in r] for r in rows])
    accept_length = 1
    accept_cand = candidates[0][:1]
    best_candidate = 0
    adjustflag = False
    for i in range(1, candidates.shape[1]):
        if i != accept_length:
            break
        adjustflag = False
        is_eq = (candidates[:, :accept_length] == accept_cand).all(dim=1)
        fi = int(torch.nonzero(is_eq, as_tuple=True)[0][0])
        gtp = p[rows[fi][i - 1]].clone()  # softmax(logits_processor(logits[fi, i - 1]))
        candidates_set: list[int] = []
        for j in range(candidates.shape[0]):
            if not is_eq[j]:
                continue
            x = candidates[j, i]
            xi = int(x)
            if xi in candidates_set or xi == -1:
                continue
            candidates_set.append(xi)
            r = draw(i, rows[j][i])
            px = gtp[xi]
            cum = torch.cumsum(gtp[nearest[xi, :k]], dim=0)
            found = (cum <= delta).nonzero(as_tuple=True)[0]
            indices = -1 if found.numel() == 0 else int(found[-1])
            if indices != -1:
                px = px + cum[indices]
            if r <= px / 1.0:  # qx = 1
                accept_cand = torch.cat((accept_cand, x[None]), dim=0)
                accept_length += 1
                best_candidate = j
                break
            gtp[xi] = 0
            if indices != -1:
                gtp[nearest[xi, :k + 1]] = 0
            if gtp.sum() == 0:
                gtp = torch.ones_like(gtp)
            gtp /= gtp.sum()
            adjustflag = True
    if adjustflag and accept_length != candidates.shape[1]:
        sample_p = gtp
    else:
        sample_p = p[rows[best_candidate][accept_length - 1]]
    return accept_length - 1, accept_cand[1:].tolist(), sample_p


def lantern_greedy_transcribed(logits: Tensor, children: Tensor, tokens: Tensor, nearest: Tensor, k: int,
                               delta: float) -> tuple[int, list[int], int]:
    """evaluate_posterior's greedy branch (logits_processor None) with lantern=True on one tree:
    logits [1+m, V] after each block node. Returns (accepted drafts, their tokens, next token)."""
    rows = _rows(children)
    candidates = torch.tensor([[int(tokens[x]) if x >= 0 else -1 for x in r] for r in rows])
    row_logits = logits[torch.tensor([[x if x >= 0 else 0 for x in r] for r in rows])]  # [rows, L, V]
    gtp = torch.softmax(row_logits, dim=-1)
    xi = candidates[:, 1:]
    valid = xi != -1
    xi_valid = xi.clone()
    xi_valid[~valid] = 0
    px = gtp.gather(-1, xi_valid[..., None])[..., 0] * valid
    near = nearest[xi_valid][:, :, :k].clone()
    near[~valid[..., None].expand_as(near)] = 0
    near_p = gtp.gather(-1, near) * valid[..., None]
    cum = torch.cumsum(near_p, dim=-1)
    approx = (px[..., None] + cum) * valid[..., None]
    # calculate_tvd: 0.5 |target - approx| over [p(x) repeated, neighbours] vs [approx, zeros]
    target_p = torch.cat([px[..., None].expand_as(cum), near_p], -1) * valid[..., None]
    approx_full = torch.cat([approx, torch.zeros_like(near_p)], -1) * valid[..., None]
    tvd = torch.nan_to_num(0.5 * (target_p - approx_full).abs(), nan=0.0)
    tvd = tvd[..., :k] + torch.cumsum(tvd[..., k:], -1)
    tvd[~valid] = float("inf")
    ok = tvd <= delta
    none = torch.full_like(tvd, -1, dtype=torch.long)
    index = torch.where(ok, torch.arange(k).expand_as(tvd), none).max(-1)[0]
    pooled = approx.gather(-1, (index * (index >= 0))[..., None])[..., 0]
    adjusted = torch.where(index >= 0, pooled, px) * valid
    gtp.scatter_(-1, xi_valid[..., None], adjusted[..., None])
    top = torch.argmax(gtp, dim=-1)[:, :-1]
    mask = (xi == top).int() * valid
    lengths = torch.cumprod(mask, dim=1).sum(dim=1)
    accept_length = int(lengths.max())
    best = 0 if accept_length == 0 else int(torch.argmax(lengths))
    nxt = int(row_logits[best, accept_length].argmax())
    return accept_length, candidates[best, 1:accept_length + 1].tolist(), nxt


# ----------------------------------------------------------------------------- hand-built trees
# block: 0 root, 1..3 the root's children (rank order), 4 under node 3, 5 under node 1, 6 under node 4
TOKENS = torch.tensor([0, 1, 4, 6, 8, 9, 3])
CHILDREN = torch.tensor([[1, 2, 3], [5, -1, -1], [-1, -1, -1], [4, -1, -1], [6, -1, -1], [-1, -1, -1],
                         [-1, -1, -1]])
DEPTH = torch.tensor([1, 1, 1, 2, 2, 3])
V = 12


def _zero_mass_tree() -> tuple[Tensor, Tensor]:
    """p after every node (top-k filtered: most codes have mass 0) and the neighbour table. At the
    root: candidate 1 (p 0.1) has neighbours 2, 3 of zero mass, then 4 (0.5): LANTERN counts it as
    pooled with nothing moved and, rejected, takes 2, 3, 4, 7 out of p; candidate 4 then has p 0;
    candidate 6 pools its zero-mass neighbour 0 and, rejected, takes 5 out too."""
    p = torch.zeros(7, V)
    p[0, [1, 4, 5, 6]] = torch.tensor([0.1, 0.5, 0.2, 0.2])
    p[1, [9, 10]] = torch.tensor([0.3, 0.7])
    p[3, [8, 11, 2]] = torch.tensor([0.25, 0.35, 0.4])
    p[4, [3, 10]] = torch.tensor([0.15, 0.85])
    p[2, 0] = p[5, 0] = p[6, 0] = 1.0
    nearest = _table(V, {1: [2, 3, 4, 7], 4: [5, 1, 0, 2], 6: [0, 5, 11, 10], 8: [7, 11, 2, 10],
                         3: [2, 10, 11, 7], 9: [10, 5, 0, 1]})
    return p, nearest


def _harness_sampling(rule: LanternRule, p: Tensor, nearest: Tensor, u: Tensor) -> Outcome:
    got = accept_tree(p[None], CHILDREN[None], TOKENS[None], DEPTH[None], u[None], torch.tensor([10]), rule,
                      _Table(nearest))  # type: ignore[arg-type]
    a = int(got.accepted[0])
    return a, TOKENS[got.path[0, :a]].tolist(), got.dist[0]


def _draw_from(u: Tensor) -> Callable[[int, int], float]:
    """The harness's uniform of a candidate: u[level - 1, its rank among its parent's children]."""
    def draw(level: int, node: int) -> float:
        parent = int((CHILDREN == node).any(-1).nonzero()[0])
        return float(u[level - 1, int((CHILDREN[parent] == node).nonzero()[0])])
    return draw


@pytest.mark.parametrize("case,u_root,u_deeper,want", [
    ("all rejected", [0.5, 0.3, 0.7], [0.9, 0.9, 0.9], 0),  # 6 pooled, rejected: nothing left -> uniform
    ("third accepted", [0.5, 0.3, 0.2], [0.95, 0.9, 0.9], 1),  # 8 rejected at level 2 after pooling
    ("two levels", [0.5, 0.3, 0.2], [0.3, 0.9, 0.9], 2),
])
def test_sampling_branch_equals_evaluate_posterior_step_by_step(case: str, u_root: list[float],
                                                                u_deeper: list[float], want: int) -> None:
    p, nearest = _zero_mass_tree()
    u = torch.tensor([u_root, u_deeper, u_deeper, u_deeper])
    rule = LanternRule(k=3, delta=0.4)
    official = lantern_sampling_transcribed(p, CHILDREN, TOKENS, nearest, 3, 0.4, _draw_from(u))
    ours = _harness_sampling(rule, p, nearest, u)
    assert official[0] == ours[0] == want and official[1] == ours[1], case
    torch.testing.assert_close(ours[2], official[2], atol=1e-6, rtol=1e-6)
    # step by step at the root: every candidate's acceptance probability and what rejecting it leaves
    ctx, dist = _Table(nearest), p[:1]
    for x, prob, left in [(1, 0.1, {5: 0.5, 6: 0.5}), (4, 0.0, {5: 0.5, 6: 0.5}), (6, 0.5, None)]:
        got_prob, dist = rule.candidate(dist, torch.tensor([x]), ctx)  # type: ignore[arg-type]
        assert float(got_prob) == pytest.approx(prob)
        want_left = torch.full((V,), 1.0 / V) if left is None else torch.zeros(V).index_put_(
            (torch.tensor(list(left)),), torch.tensor(list(left.values())))
        torch.testing.assert_close(dist[0], want_left)


def test_pooling_only_moved_mass_departs_from_evaluate_posterior() -> None:
    """`pooled_if: mass` (the earlier rule, kept as an option) removes only x after a zero-mass
    pooling, so the sibling after it keeps its mass: the same draws end elsewhere."""
    p, nearest = _zero_mass_tree()
    u = torch.tensor([[0.5, 0.3, 0.7]] + [[0.9, 0.9, 0.9]] * 3)
    official = lantern_sampling_transcribed(p, CHILDREN, TOKENS, nearest, 3, 0.4, _draw_from(u))
    mass = _harness_sampling(LanternRule(k=3, delta=0.4, pooled_if="mass"), p, nearest, u)
    assert official[0] == 0 and mass[0] == 1 and mass[1] == [4]  # 4 keeps its 0.5 / 0.9 and is accepted


@pytest.mark.parametrize("seed", range(6))
def test_sampling_branch_equals_evaluate_posterior_on_random_filtered_trees(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    vocab, accepted, rejected = 12, 0, 0
    for trial in range(40):
        logits = torch.randn(7, vocab, generator=g) * 2
        params = SamplingParams(top_k=4, top_p=0.9, filter_order="top_p_first")
        p = filter_logits(logits, params).softmax(-1)
        likely = torch.rand(7, 6, generator=g) * (torch.rand(7, 6, generator=g) < 0.5)
        p[:, TOKENS[1:]] += likely  # the drafts often carry mass
        p /= p.sum(-1, keepdim=True)
        nearest = _table(vocab, {}, seed=100 * seed + trial)
        u = torch.rand(4, 3, generator=g)
        official = lantern_sampling_transcribed(p, CHILDREN, TOKENS, nearest, 3, 0.4, _draw_from(u))
        ours = _harness_sampling(LanternRule(k=3, delta=0.4), p, nearest, u)
        assert official[:2] == ours[:2], trial
        torch.testing.assert_close(ours[2], official[2], atol=1e-6, rtol=1e-5)
        accepted += official[0] >= 2
        rejected += official[0] < 3
    assert accepted and rejected, "both ends of the walk must be seen"


# ----------------------------------------------------------------------------- greedy
def _greedy_logits() -> tuple[Tensor, Tensor]:
    """Logits where no draft is the plain argmax at the root, but candidate 1 (p 0.3 < 0.35 of code
    0) becomes it with its neighbour 2 (0.2) pooled; node 1's child 9 is the argmax anyway; 4 and 6
    stay below 0 even when boosted."""
    p = torch.full((7, V), 0.01)
    p[0, [0, 1, 2]] = torch.tensor([0.35, 0.3, 0.2])
    p[1, [9, 10]] = torch.tensor([0.6, 0.2])
    p[3, [8, 11]] = torch.tensor([0.5, 0.3])
    p[4, [3]] = torch.tensor([0.6])
    p /= p.sum(-1, keepdim=True)
    nearest = _table(V, {1: [2, 5, 7], 4: [10, 11, 7], 6: [11, 10, 7]})
    return p.log(), nearest


def _harness_greedy(rule: LanternRule, logits: Tensor, nearest: Tensor) -> tuple[int, list[int], int]:
    got = accept_tree_greedy(logits.softmax(-1)[None], CHILDREN[None], TOKENS[None], DEPTH[None],
                             torch.tensor([10]), 4, rule, _Table(nearest))  # type: ignore[arg-type]
    a = int(got.accepted[0])
    return a, TOKENS[got.path[0, :a]].tolist(), int(got.dist[0].argmax())


def test_greedy_lantern_accepts_where_boosting_changes_the_argmax() -> None:
    logits, nearest = _greedy_logits()
    for delta, want in ((0.4, 2), (0.1, 0)):  # 0.2 of pooled mass fits 0.4, not 0.1
        official = lantern_greedy_transcribed(logits, CHILDREN, TOKENS, nearest, 3, delta)
        ours = _harness_greedy(LanternRule(k=3, delta=delta), logits, nearest)
        assert official == ours and ours[0] == want, delta
    assert _harness_greedy(LanternRule(k=3, delta=0.4), logits, nearest)[1] == [1, 9]


@pytest.mark.parametrize("seed", range(4))
def test_greedy_lantern_equals_evaluate_posterior_on_random_trees(seed: int) -> None:
    """Peaky random logits, with siblings often both accepted (the first longest row wins)."""
    g = torch.Generator().manual_seed(seed)
    lengths = set()
    for trial in range(60):
        logits = torch.randn(7, V, generator=g) * 1.5
        logits.scatter_add_(-1, TOKENS[CHILDREN.clamp_min(0)],
                            (CHILDREN >= 0) * torch.rand(7, 3, generator=g) * 3)
        nearest = _table(V, {}, seed=1000 * seed + trial)
        delta = float(torch.rand(1, generator=g)) * 0.6
        official = lantern_greedy_transcribed(logits, CHILDREN, TOKENS, nearest, 4, delta)
        ours = _harness_greedy(LanternRule(k=4, delta=delta), logits, nearest)
        assert official == ours, trial
        lengths.add(ours[0])
    assert {0, 1, 2} <= lengths, lengths


# ----------------------------------------------------------------------------- filter order
def _lantern_processor_transcribed(logits: Tensor, top_k: int, top_p: float) -> Tensor:
    """prepare_logits_processor at temperature 1: transformers' TopPLogitsWarper then
    TopKLogitsWarper, in plain torch (ascending sort, drop the tail of mass <= 1 - top_p; then
    below the k-th largest)."""
    x = logits.clone()
    sorted_x, order = torch.sort(x, descending=False)
    tail = sorted_x.softmax(-1).cumsum(-1) <= (1 - top_p)
    tail[..., -1:] = False  # min_tokens_to_keep = 1
    x = x.masked_fill(tail.scatter(-1, order, tail), float("-inf"))
    kth = torch.topk(x, top_k)[0][..., -1, None]
    return x.masked_fill(x < kth, float("-inf"))


def test_filter_orders_keep_different_sets() -> None:
    logits = torch.tensor([0.5, 0.25, 0.15, 0.1]).log()
    kept = {order: torch.isfinite(filter_logits(logits, SamplingParams(top_k=2, top_p=0.6,
                                                                        filter_order=order)))
            for order in SamplingParams.FILTER_ORDERS}
    assert kept["top_k_first"].tolist() == [True, False, False, False]  # top-2 renormalised: 0.67 >= 0.6
    assert kept["top_p_first"].tolist() == [True, True, False, False]  # nucleus {0, 1}, then top-2
    assert SamplingParams().filter_order == "top_k_first"
    g = torch.Generator().manual_seed(0)
    differ = 0
    for _ in range(200):
        logits = torch.randn(16, generator=g) * 2
        top_k = int(torch.randint(1, 10, (1,), generator=g))
        top_p = float(torch.rand(1, generator=g)) * 0.9 + 0.05
        ours = filter_logits(logits, SamplingParams(top_k=top_k, top_p=top_p, filter_order="top_p_first"))
        official = _lantern_processor_transcribed(logits, top_k, top_p)
        assert torch.equal(torch.isfinite(ours), torch.isfinite(official))
        other = filter_logits(logits, SamplingParams(top_k=top_k, top_p=top_p))
        differ += not torch.equal(torch.isfinite(ours), torch.isfinite(other))
    assert differ > 10


def test_a_bad_filter_order_is_refused() -> None:
    with pytest.raises(ConfigValueError, match="sampling.filter_order must be one of"):
        SamplingParams(filter_order="top_p")


# ----------------------------------------------------------------------------- the head file
def test_a_lantern_head_stored_as_model_safetensors_loads(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    cfg = GPTConfig(vocab_size=32, grid=(16, 16), dim=64, n_layer=1, n_head=4, prefix_len=120, caption_dim=8,
                    prefix_rope="zero")
    head = random_head(cfg, torch.randn(32, 64), seed=3, ffn_dim=96)
    config = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 96,
              "vocab_size": 32, "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "input_type": "t2i"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    state = {k: v.half().contiguous() for k, v in head.state_dict().items()}
    save_file(state, str(tmp_path / "model.safetensors"))  # no metadata: LANTERN's from_pretrained fallback
    loaded = build_head(cfg, torch.zeros(32, 64), file="model.safetensors", config_file="config.json",
                        local_dir=str(tmp_path))
    for key, value in head.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value.half().float())
    with pytest.raises(WeightsError, match=r"no 'eagle_head' metadata .* set model.eagle_head_config"):
        build_head(cfg, torch.zeros(32, 64), file="model.safetensors", local_dir=str(tmp_path))
