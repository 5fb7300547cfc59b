"""Tree speculative decoding: EAGLE-2 (Li et al., 2024) and LANTERN (Jang et al., ICLR 2025) as
LANTERN runs them on LlamaGen. Each round:

1. the `eagle` source drafts a dynamic tree after the root, the last committed token
   (baselines/methods/eagle.py; the head's catch-up and `depth` expansions), or the `static_tree`
   source LANTERN++'s fixed topology (baselines/methods/static_tree.py, verified against the
   drafter's q by `lantern_pp`, baselines/methods/lantern_pp.py);
2. ONE target forward verifies the root and the tree's m = total_tokens - 1 nodes with tree
   attention on the static, position-indexed KV cache: the root is written to its own position's
   slot, node j to scratch slot S + j after the sequence's S slots, each node at the position of
   its depth (nodes of one depth share a rotary position) and attending to the committed sequence
   and its ancestors only (baselines/draft_tree.tree_attention);
3. the acceptance rule walks the tree (baselines/acceptance.accept_tree: `exact` for EAGLE-2,
   `lantern` for LANTERN) and the next token is drawn from what remains; in greedy mode a rule with
   `greedy_boost` (LANTERN) decides as LANTERN's greedy branch does (`accept_tree_greedy`: relaxed
   argmax over the softmax of the logits, the longest accepted path);
4. the accepted path's keys/values move from their scratch slots to their positions' slots
   (`move_cache`; a node was rotated by its position, so this equals re-encoding the path), and
   the head reads the target's features of the path (the next round's catch-up).

Randomness: per image per round L x K + 1 uniforms (L = depth + 1 levels, K = top_k siblings),
drawn whether used or not, so an image does not depend on its batch. Finished rows ride along
(their writes land on the last sequence slot and on scratch slots) and commit nothing.

Statistics (baselines/framework/recorder.py): one target forward and depth + 1 head forwards (drafter
forwards) per round; accepted_per_step = accepted drafts + 1 (the mean is LANTERN's "step
compression", the mean accepted length per round); `proposed` counts the tree nodes that could be
accepted (inside the image).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from baselines.framework.acceptance import TreeRule, accept_tree, accept_tree_greedy
from baselines.framework.canvas import Context, span
from baselines.framework.draft_tree import tree_attention
from baselines.methods.eagle import EagleDraft
from baselines.methods.static_tree import StaticTreeDraft
from baselines.methods.tree_fit import tree_misfit
from baselines.framework.recorder import StatsRecorder
from harness.api import ConfigValueError, Condition, Generation, ModelBundle, SamplingParams
from harness.runtime.hostsync import Running
from harness.runtime.randomness import ImageStreams
from harness.runtime.sampling import inverse_cdf, probs, sample


class TreeDecoder:
    """Draft-tree speculative decoding from an `eagle` draft source and a tree acceptance rule.

    Args:
        sampling: how logits become p, for the target and the head's ranking.
        draft: an EagleDraft (depth, top_k, total_tokens) or a StaticTreeDraft (LANTERN++'s fixed
            topology, baselines/methods/static_tree.py: its sampled trees carry q).
        accept: a rule with `candidate` (ExactRule: EAGLE-2; LanternRule: LANTERN); a sampled static
            tree's rule also has `drafted_siblings` (RelativeLanternRule: LANTERN++).
        name: decoder label; default "eagle+<rule>".
    """

    def __init__(self, sampling: SamplingParams, draft: EagleDraft | StaticTreeDraft, accept: TreeRule,
                 name: str | None = None) -> None:
        if not hasattr(accept, "candidate"):
            raise ConfigValueError(f"decoder accept {getattr(accept, 'name', accept)!r} cannot decide over a "
                                   "draft tree (it has no `candidate`); use baselines.framework.acceptance.ExactRule "
                                   "or LanternRule")
        self.sampling = sampling
        self.draft = draft
        self.accept = accept
        self.name = name or f"{draft.name}+{accept.name}"

    @property
    def cache_scratch(self) -> int:
        """Scratch cache slots the target needs (one per tree node; harness/runtime/engine.reserve)."""
        return int(self.draft.options.nodes)

    def misfit(self, models: ModelBundle, rows: int, memory: int) -> tuple[str, str] | None:
        """(option, why) when the draft tree cannot fit these models, checked before anything is bound
        or generated (harness/run.py): top_k distinct codes per node need top_k <= the image codes,
        and the tree's nodes (scratch cache slots), each with a distribution over the codes in a
        verification of `rows` rows, must fit in `memory` bytes (a lower bound of what they need)."""
        return tree_misfit(models, rows, memory, width=self.draft.options.top_k, width_option="draft.top_k",
                           slots=self.cache_scratch, size_option="draft.total_tokens", size_hint="lower it")

    @torch.inference_mode()
    def generate(self, models: ModelBundle, cond: Condition, seeds: Sequence[int]) -> Generation:
        """cond of batch B, seeds [B] -> tokens [B, rows*cols] and one DecodeStats per image."""
        target = models.target
        for need in ("hidden", "move_cache", "head_logits", "model_rows"):
            if not hasattr(target, need):
                raise ConfigValueError(f"model {models.name!r}: its target ({type(target).__name__}) has no "
                                       f"`{need}`; draft trees need a GPT-based target (TokenImageModel)")
        opts = self.draft.options
        b, m, levels, k = len(seeds), opts.nodes, opts.levels, opts.top_k
        rows, cols = target.grid
        n_tokens = rows * cols
        seq = int(target.cache_len)  # S: prefix + image slots; scratch slots follow
        prefix = seq - n_tokens
        target.setup_cache(b, scratch=m)
        logits = target.prefill(cond)  # [B, V]: position 0
        device = logits.device
        streams = ImageStreams(seeds, device)
        ctx = Context(models=models, cond=cond, sampling=self.sampling, streams=streams, device=device)
        run = self.draft.start(target, models.eagle_head, self.sampling, models.name, streams=streams)
        tokens = torch.zeros(b, n_tokens + levels + 1, dtype=torch.long, device=device)
        tokens[:, 0] = sample(logits, self.sampling, streams)
        root = torch.zeros(b, dtype=torch.long, device=device)  # image position of the root
        ids = torch.zeros(b, prefix, dtype=torch.long, device=device)  # caption slots pair with token 0
        ids[:, -1] = tokens[:, 0]
        run.catch_up(target.hidden, ids, root, torch.full_like(root, prefix))
        rec = StatsRecorder(b, (rows, cols), device)
        rec.forward(torch.ones(b, dtype=torch.bool, device=device), torch.ones_like(root))  # the prefill
        step = span(levels, device)
        scratch = seq + torch.arange(m, device=device)
        running = Running(device)  # the loop's one host read per round (harness/runtime/hostsync.py)
        while running(active := root < n_tokens - 1):
            remaining = (n_tokens - 1 - root).clamp_min(0)  # positions after the root
            tree = run.expand(root)
            block = torch.cat([tokens.gather(1, root[:, None]), tree.tokens], 1)  # [B, 1+m]
            positions = torch.cat([root[:, None], root[:, None] + tree.depth], 1).clamp(max=n_tokens - 1)
            write = torch.cat([prefix + root[:, None], scratch.expand(b, -1)], 1)
            mask = tree_attention(tree.ancestry, prefix + root, seq, seq + m)
            logits = target.forward(block, positions, mask, slots=write)  # [B, 1+m, V], CFG-mixed
            hidden = target.hidden  # [R, 1+m, dim]
            u = streams.draw((levels * k + 1,))
            if self.sampling.greedy and hasattr(self.accept, "greedy_boost"):  # LANTERN's greedy branch
                verdict = accept_tree_greedy(logits.float().softmax(-1), tree.children, block, tree.depth,
                                             remaining, levels, self.accept, ctx)  # type: ignore[arg-type]
            else:
                verdict = accept_tree(probs(logits, self.sampling), tree.children, block, tree.depth,
                                      u[:, :-1].reshape(b, levels, k), remaining, self.accept, ctx, q=tree.q)
            a = verdict.accepted  # 0 for finished rows: their limit `remaining` is 0
            final = inverse_cdf(verdict.dist, u[:, -1])
            # commit the path: cache slots, tokens, the head's catch-up
            at = (root + 1)[:, None] + span(levels + 1, device)  # [B, L+1] positions after the root
            moving = step[None] < a[:, None]
            target.move_cache(torch.where(moving, seq - 1 + verdict.path, seq),
                              torch.where(moving, prefix + at[:, :levels], seq))
            new = torch.cat([block.gather(1, verdict.path), final[:, None]], 1)  # [B, L+1] level by level
            new.scatter_(1, a[:, None], final[:, None])  # the drawn token right after the path
            # positions after root + a + 1 get placeholders that later rounds overwrite before they are
            # read (catch-up entries past `count` go to the head's dump slot; a finished row writes
            # past the image)
            tokens.scatter_(1, at, new)
            path = torch.cat([torch.zeros_like(root)[:, None], verdict.path], 1)  # root + accepted nodes
            feats = hidden.gather(1, target.model_rows(path)[..., None].expand(-1, -1, hidden.shape[-1]))
            run.catch_up(feats, new, prefix + root, torch.where(active, a + 1, 0))
            advance = torch.minimum(a + 1, remaining)
            self._record(rec, active, root, tree.depth, remaining, a, verdict.rejected, advance, levels)
            root = root + advance
        self._summarise(rec, rec.stacked(), levels)
        stats = rec.finish(with_drafts=True)
        return Generation(tokens=tokens[:, :n_tokens].clone(), stats=stats)

    @staticmethod
    def _record(rec: StatsRecorder, active: Tensor, root: Tensor, depth: Tensor, remaining: Tensor,
                accepted: Tensor, rejected: Tensor, advance: Tensor, levels: int) -> None:
        """Keep one round's raw tensors; `_summarise` counts all rounds at once."""
        rec.step(active=active, root=root, depth=depth, remaining=remaining, accepted=accepted,
                 rejected=rejected, advance=advance)

    @staticmethod
    def _summarise(rec: StatsRecorder, s: dict[str, Tensor], levels: int) -> None:
        """Every round from the stacked rounds s[name] [S, B, ...]: a target forward and `levels`
        head forwards each, the tree nodes inside the image (proposed), the accepted drafts, and the
        rejection at the first unaccepted position."""
        if not s:
            return
        rec.forward(s["active"], s["advance"], target=1, drafter=levels)
        offsets = torch.arange(levels, device=s["root"].device)
        stopped = s["rejected"] & (s["accepted"] < s["remaining"])
        rec.drafts(s["active"], s["root"] + 1, proposed=(s["depth"] <= s["remaining"][..., None]).sum(-1),
                   accepted=s["accepted"], resampled=stopped.long(),
                   rejected=(offsets == s["accepted"][..., None]) & stopped[..., None])
