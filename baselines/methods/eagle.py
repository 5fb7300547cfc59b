"""`eagle` draft source: an EAGLE head (harness/models/eagle_head.py) on the target's last hidden
states drafts EAGLE-2's dynamic tree (baselines/framework/draft_tree.py) each round.

Per round, as LANTERN runs it on LlamaGen (models/drafters/cnets_llamagen.py `topK_genrate`):
1. catch-up (one head forward): the head reads the target's features of the tokens the last
   verification committed (the root and the accepted path), each paired with the token after it,
   into its cache; its output at the newest token drafts the root's children;
2. `depth` expansions (one head forward each): the k best nodes of the newest level, fed with the
   head output of their parent as feature, all at the position of their depth, each attending to
   the head's cache and its own ancestors among the fed nodes (scratch slots after the sequence);
3. rerank to total_tokens - 1 nodes.
Head logits come from the target's output layer, CFG-mixed with the target's scale (the head runs
on the conditional and the unconditional rows: `Guided.model_rows`) and filtered like the
target's p (temperature, top-k, top-p: harness/sampling.filter_logits); log-softmax ranks them.

Head cache slots: P + N - 1 sequence slots (head index i pairs the target's slot i with the token
of slot i + 1), one dump slot for padding entries of a fixed-width catch-up, and depth x top_k
scratch slots for the fed tree nodes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from baselines.framework.canvas import span
from baselines.framework.draft_tree import DraftTree, Pool, TreeOptions, select
from harness.api import ConfigValueError, SamplingParams
from harness.models.masks import attention_mask
from harness.runtime.randomness import ImageStreams
from harness.runtime.sampling import filter_logits


class EagleDraft:
    """`eagle`: EAGLE-2's dynamic tree drafted by the target's EAGLE head (module docstring).

    Args:
        depth: expansions after the root's (LANTERN on LlamaGen: 4).
        top_k: children per expanded node and nodes expanded per level (10).
        total_tokens: tokens verified per round, the root included (59).
    """

    name = "eagle"

    def __init__(self, depth: int = 4, top_k: int = 10, total_tokens: int = 59) -> None:
        self.options = TreeOptions(depth=depth, top_k=top_k, total_tokens=total_tokens)

    def start(self, target, head, sampling: SamplingParams, model: str,  # noqa: ANN001
              streams: ImageStreams | None = None) -> "EagleRun":
        """The per-call drafting state for `target` (an ARImageModel with draft-tree support) and
        its `head`, after the target's prefill (its `hidden` holds the prefix features); `model`:
        the bundle's name, for errors; `streams`: the per-image random streams (EAGLE-2's top-k
        tree draws nothing; LANTERN++'s sampled static tree does)."""
        check_head(target, head, model)
        self.options.check_vocab(int(target.vocab_size), model)
        return EagleRun(self.options, target, head, sampling)


def check_head(target, head, model: str) -> None:  # noqa: ANN001
    """Refuse a missing head, or one drafting another grid or vocabulary than the target's."""
    if head is None:
        raise ConfigValueError(f"model {model!r} has no EAGLE head (model.eagle_head / eagle_head_file); "
                               "the eagle2, lantern and lantern_pp decoders draft with one (a decoder of your own that drafts "
                               "with it lists `requires: [eagle_head]` in its config, or the job does not load "
                               "the head). Train one with `python -m baselines.training.train_eagle`, or use "
                               "decoder lantern_chain / sd")
    grid, vocab = tuple(target.grid), int(target.vocab_size)
    if tuple(head.cfg.grid) != grid or head.cfg.vocab_size != vocab:
        raise ConfigValueError(f"the EAGLE head of model {model!r} drafts a {tuple(head.cfg.grid)} grid "
                               f"of {head.cfg.vocab_size} codes, the target has a {grid} grid of {vocab} "
                               "codes")


@dataclass
class _Frontier:
    """The nodes of the newest level fed to the head next: pool indices, tokens, scores [B, K],
    features [R, K, dim] (model rows) and their ancestry among the fed scratch slots [B, K, F]."""

    pool: Tensor
    tokens: Tensor
    score: Tensor
    features: Tensor
    anc: Tensor


class EagleRun:
    """One generate call's head state (the head's KV cache and its newest output)."""

    def __init__(self, options: TreeOptions, target, head, sampling: SamplingParams) -> None:  # noqa: ANN001
        self.options, self.target, self.head, self.sampling = options, target, head, sampling
        rows, cols = target.grid
        self.n_tokens = rows * cols
        self.prefix = int(target.cache_len) - self.n_tokens
        self.sequence = self.prefix + self.n_tokens - 1  # head slots of the sequence
        self.dump = self.sequence  # padding entries of a catch-up write here
        self.scratch = self.sequence + 1
        self.width = self.scratch + self.fed_slots()
        features = target.hidden
        if features is None:
            raise RuntimeError("the target exposes no hidden states: prefill it before starting the head")
        if features.shape[-1] != head.cfg.dim:
            raise ConfigValueError(f"the EAGLE head is {head.cfg.dim} wide, the target's hidden states are "
                                   f"{features.shape[-1]} wide")
        head.setup_cache(features.shape[0], self.width, dtype=features.dtype)  # R rows: 2B with CFG
        self.last: Tensor | None = None  # [R, dim] head output at the newest committed token
        self.last_slot: Tensor | None = None  # [B] head slot of that output
        self._constants: _Fixed | None = None  # `_fixed`

    def fed_slots(self) -> int:
        """Head scratch slots for the tree nodes fed in one round (EAGLE-2: depth x top_k)."""
        return self.options.depth * self.options.top_k

    # ------------------------------------------------------------------ head calls
    def _head(self, features: Tensor, tokens: Tensor, seq: Tensor, mask: Tensor, write: Tensor) -> Tensor:
        """One head forward: features [R, T, dim], tokens / seq / write [B, T], mask [B, T, S]."""
        rows = self.target.model_rows
        return self.head(features, rows(tokens), rows(seq), self.target.positional, rows(mask), rows(write))

    def _logq(self, h: Tensor) -> Tensor:
        """Head outputs h [R, T, dim] -> draft log-probabilities [B, T, V]: the target's output
        layer, CFG-mixed, filtered like the target's p."""
        logits = filter_logits(self.target.head_logits(h), self.sampling)
        return logits.log_softmax(-1)

    def catch_up(self, features: Tensor, tokens: Tensor, start: Tensor, count: Tensor) -> None:
        """Encode `count` [B] entries per row at head slots start [B] .. start + count - 1: features
        [R, W, dim] of the target's sequence slots start + j, tokens [B, W] of slots start + j + 1
        (entries j >= count are padding, written to the dump slot). One head forward."""
        w = tokens.shape[1]
        j = torch.arange(w, device=tokens.device)[None]
        index = start[:, None] + j
        write = torch.where(j < count[:, None], index, torch.full_like(index, self.dump))
        seq = (index + 1).clamp(max=self.prefix + self.n_tokens - 1)
        mask = attention_mask(write, self.width)
        out = self._head(features, tokens, seq, mask, write)
        last = (count - 1).clamp(0, w - 1)
        self.last = out[torch.arange(out.shape[0], device=out.device), self.target.model_rows(last)]
        self.last_slot = start + count - 1

    def expand(self, root: Tensor) -> DraftTree:
        """The round's tree for roots at image positions root [B]: `depth` head forwards after the
        catch-up, then the rerank."""
        assert self.last is not None and self.last_slot is not None, "catch_up comes first"
        opts, rows = self.options, self.target.model_rows
        k, b = opts.top_k, root.shape[0]
        fixed = self._fixed(b, root.device)
        logq = self._logq(self.last[:, None])[:, 0]  # [B, V]: the root's children
        top = torch.topk(logq, k, dim=-1)
        pool = Pool(opts, root.device)
        pool.add(top.indices, fixed.no_parent, top.values)
        front = _Frontier(pool=fixed.ranks, tokens=top.indices, score=top.values,
                          features=self.last[:, None].expand(-1, k, -1), anc=fixed.no_anc)
        seen = (span(self.scratch, root.device) <= self.last_slot[:, None])[:, None]  # [B, 1, scratch]
        # level i's nodes propose position root + i + 2 and are fed at that position's sequence slot
        seq = rows((self.prefix + 1 + root[:, None] + span(opts.depth, root.device))
                   .clamp(max=self.prefix + self.n_tokens - 1))  # [R, depth]
        for i in range(opts.depth):
            anc = front.anc | fixed.own[i]  # [B, K, F]: the fed ancestors and the node itself
            mask = torch.cat([seen.expand(-1, k, -1), anc], -1)  # [B, K, width]
            out = self.head(front.features, rows(front.tokens), seq[:, i:i + 1].expand(-1, k),
                            self.target.positional, rows(mask), fixed.writes[i])  # [R, K, dim]
            child = torch.topk(self._logq(out), k, dim=-1)  # [B, K, K]
            score = (front.score[:, :, None] + child.values).flatten(1)  # [B, K*K]
            base = pool.size
            pool.add(child.indices.flatten(1), front.pool[:, :, None].expand(-1, -1, k).flatten(1), score)
            if i + 1 < opts.depth:
                best = torch.topk(score, k, dim=-1).indices  # [B, K]
                parent = best // k
                picked = rows(parent)[..., None].expand(-1, -1, out.shape[-1])
                front = _Frontier(pool=base + best, tokens=child.indices.flatten(1).gather(1, best),
                                  score=score.gather(1, best), features=out.gather(1, picked),
                                  anc=anc.gather(1, parent[..., None].expand(-1, -1, anc.shape[-1])))
        return select(pool, opts.nodes, k)

    def _fixed(self, b: int, device: torch.device) -> "_Fixed":
        """The expansions' constants for batch b, made on the first round of the call."""
        if self._constants is None:
            opts, k = self.options, self.options.top_k
            fed = opts.depth * k
            slots = self.scratch + span(fed, device).view(opts.depth, 1, k).expand(-1, b, -1)
            self._constants = _Fixed(
                ranks=span(k, device).expand(b, -1),
                no_parent=torch.full((b, k), -1, dtype=torch.long, device=device),
                no_anc=torch.zeros(b, k, fed, dtype=torch.bool, device=device),
                own=torch.eye(fed, dtype=torch.bool, device=device).view(opts.depth, k, fed),
                writes=[self.target.model_rows(level) for level in slots])
        return self._constants


@dataclass
class _Fixed:
    """What every round's expansions share (batch B, K = top_k, F = depth x K fed slots): sibling
    ranks [B, K], the root children's parent (-1) [B, K], an empty ancestry [B, K, F], `own`
    [depth, K, F] (level i's node j is fed at scratch slot i*K + j and sees itself) and the head
    slots each level writes, in model rows (`writes[i]` [R, K])."""

    ranks: Tensor
    no_parent: Tensor
    no_anc: Tensor
    own: Tensor
    writes: list[Tensor]
