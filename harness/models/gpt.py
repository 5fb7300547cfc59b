"""A LlamaGen-style decoder-only transformer with a static, position-indexed KV cache.

Parameter names and shapes follow LlamaGen's `autoregressive/models/gpt.py` (`tok_embeddings`,
`layers.{i}.attention.wqkv`, `layers.{i}.feed_forward.w1/w2/w3`, `cls_embedding.cap_proj.fc1/fc2`,
`cls_embedding.uncond_embedding`, `norm`, `output`) so that official checkpoints load strictly.

Sequence layout (cache slots): `prefix_len` condition slots, then one slot per image token:
image raster position i lives in slot `prefix_len + i`. The output at slot s predicts the token of
the next slot, so the last prefix slot predicts image position 0.

Official-checkpoint options: `prefix_rope="zero"` gives the prefix slots LlamaGen's all-zero rotary
table (their queries and keys vanish, as in `precompute_freqs_cis_2d`); the table stays float32
when the model is cast to bf16/fp16 and queries and keys are rotated in float32, as LlamaGen's
`apply_rotary_emb` does; `cond_embed="linear"` is Tar
AR-DTok's `clip_proj` (a biased linear map; unconditional rows are zero features); `pos_embed=
"abs_pe"` is Tar AR-DTok's learned absolute table `abs_pe` [1, L, dim]; `prefill(cond, prefix_mask)`
applies LlamaGen's caption padding mask (a padded prefix slot is seen only by itself) to every later
forward. The shapes world's GPT (word-id captions and more) extends this one: harness/shapes/gpt.py.

Draft trees (EAGLE-2, baselines/methods/tree_decoding.py): `setup_cache(..., scratch=m)` adds m scratch slots
after the `slots` of the sequence, `forward_cached(..., slots=)` writes a forward's keys/values to
given cache slots while its positions (rotary or absolute) stay the image positions, so that tree
nodes of one depth share a position and each has a slot of its own, and `move_cache` copies the
entries of an accepted path to their positions' slots. Every forward keeps the last hidden states
after the final norm of the positions it computed in `last_hidden` (the features an EAGLE head
reads; no extra forward).

Decode engine (harness/runtime/engine.py): `setup_cache` views a cache store allocated once at the
largest shape (`reserve`) and the slot-causal mask table; `compile_cached` compiles the cached
forward's layers for `engine=compiled`, as a function of this model's own (torch counts graphs per
code object, so each model has its own recompile budget, harness/runtime/graphs.py). A compiled
GPT pads every cached forward to a power-of-two width (`graphs.graph_width`): padded positions
write one trash slot at the end of the cache that no real query sees, and their outputs are
dropped. Cached forwards return logits in the weights' dtype to `raw=True` callers, float logits
to the others. A caller that mixes (guidance, harness/models/guidance.py) may pass its mix
instead: a forward wider than `LOGITS_CHUNK` then projects its hidden states through the output
layer `LOGITS_CHUNK` positions at a time and mixes each chunk, so that no [2B, T, V] logits exist
(MuLo-SD's whole-image verification at 1024 px: 4.3 GB at batch 16).
"""
from __future__ import annotations

import time
import types

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.models import chunked_logits
from harness.models.chunked_logits import Outputs
from harness.models.condition import TextCondition
from harness.models.gpt_config import GPTConfig
from harness.models.masks import attention_mask, hide
from harness.models.transformer import KVCache, RMSNorm, TransformerBlock, rope_2d_table
from harness.runtime import graphs


class MLP(nn.Module):
    """Caption projection: fc1 -> GELU(tanh) -> fc2, no biases."""

    def __init__(self, in_features: int, hidden: int, out_features: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden, bias=False)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(hidden, out_features, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class CaptionEmbedder(nn.Module):
    """LlamaGen's cls_embedding: condition features [B, P, caption_dim] -> prefix embeddings
    [B, P, dim]; rows flagged null take the learned unconditional embedding (`with_null`)."""

    def __init__(self, caption_dim: int, dim: int, prefix_len: int) -> None:
        super().__init__()
        self.cap_proj = MLP(caption_dim, dim, dim)
        self.register_buffer("uncond_embedding", torch.randn(prefix_len, caption_dim) / caption_dim**0.5)

    def with_null(self, features: Tensor, null: Tensor) -> Tensor:
        """features [B, P, caption_dim], null [B] -> features with null rows replaced."""
        return torch.where(null[:, None, None], self.uncond_embedding.to(features.dtype), features)

    def forward(self, features: Tensor) -> Tensor:
        return self.cap_proj(features)


class GPT(nn.Module):
    """Text-conditioned AR transformer over image tokens (training and cached inference).
    Subclasses may read other captions (`_build_inputs`, `_features`) and add a condition to every
    image token (`_token_bias`)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self._build_inputs(cfg)
        self.tok_dropout = nn.Dropout(cfg.dropout)
        if cfg.pos_embed == "abs_pe":
            self.abs_pe = nn.Parameter(torch.zeros(1, cfg.pos_embed_len or self.slots - 1, cfg.dim))
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        table = rope_2d_table(cfg.grid, cfg.head_dim, cfg.rope_base, cfg.prefix_len, cfg.prefix_rope)
        self.register_buffer("rope_table", table, persistent=False)  # float32 whatever the dtype (_apply)
        self.prefix_keep: Tensor | None = None  # [B, P] bool caption padding mask of the cached rows
        self.token_bias: Tensor | None = None  # [B, 1, dim] `_token_bias` of the cached rows
        self.scratch = 0  # cache slots after `slots` (draft-tree nodes; setup_cache)
        self.last_hidden: Tensor | None = None  # [B, T, dim] after the final norm, last forward
        self.causal: Tensor | None = None  # [S, S] bool slot-causal rows of the cache (setup_cache)
        self._stack = self._run_layers  # the cached forward's layers; `compile` replaces it
        self.compiled = False
        self.budget: graphs.GraphBudget | None = None  # the compiled forward's shapes (compile_cached)
        self.eager_prefill = False  # compiled: run the prefill eager (one graph fewer per batch size)
        for m in self.modules():  # LlamaGen's init: N(0, 0.02) weights, a zero output head
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
        nn.init.zeros_(self.output.weight)

    def _build_inputs(self, cfg: GPTConfig) -> None:
        """The condition embedder (cls_embedding, or Tar's clip_proj) and the token embedding."""
        if cfg.cond_embed == "linear":
            self.clip_proj = nn.Linear(cfg.caption_dim, cfg.dim)
        else:
            self.cls_embedding = CaptionEmbedder(cfg.caption_dim, cfg.dim, cfg.prefix_len)
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)

    def _apply(self, fn, recurse: bool = True):  # type: ignore[no-untyped-def]
        """Module moves and casts (`.to`, `.cuda`, `.bfloat16`, ...) move the rotary table but
        keep it float32, as LlamaGen keeps `freqs_cis` (a plain float32 attribute) and rotates in
        float32 (`apply_rope`): a bf16 table is off by up to 2e-3 in cos and sin. The table is a
        non-persistent buffer, so state dicts do not hold it either way."""
        table = self.rope_table
        out = super()._apply(fn, recurse)
        moved = self.rope_table
        if moved is not table and moved.dtype != table.dtype:
            self.rope_table = table.to(device=moved.device)  # the float32 values, on the new device
        return out

    @property
    def slots(self) -> int:
        return self.cfg.prefix_len + self.cfg.n_tokens

    @property
    def cache_slots(self) -> int:
        """Slots of the KV cache: the sequence's `slots` plus the `scratch` slots."""
        return self.slots + self.scratch

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # ---------------------------------------------------------------- embeddings
    def _features(self, cond: TextCondition) -> Tensor:
        """Condition -> caption features [B, P, caption_dim]."""
        if cond.features is None:
            raise ValueError("this GPT reads caption features; word-id captions need a ShapesGPT")
        return cond.features

    def _condition_features(self, cond: TextCondition) -> Tensor:
        """Condition -> features [B, P, caption_dim] with null rows replaced (zeros, or the learned
        unconditional embedding of the caption MLP)."""
        given = (cond.features if cond.ids is None else cond.ids).shape[1]
        if given != self.cfg.prefix_len:
            raise ValueError(f"condition has {given} tokens, the model expects {self.cfg.prefix_len}")
        feats = self._features(cond)
        if self.cfg.cond_embed == "linear":
            return torch.where(cond.null[:, None, None], torch.zeros_like(feats), feats)
        return self.cls_embedding.with_null(feats, cond.null)

    def prefix_embeddings(self, cond: TextCondition) -> Tensor:
        """Condition -> prefix embeddings [B, P, dim]."""
        return self._prefix(self._condition_features(cond))

    def _prefix(self, feats: Tensor) -> Tensor:
        if self.cfg.cond_embed == "linear":
            return self.clip_proj(feats.to(self.clip_proj.weight.dtype))
        return self.cls_embedding(feats)

    def _token_bias(self, feats: Tensor) -> Tensor | None:
        """features [B, P, caption_dim] -> a condition [B, 1, dim] added to every image token's
        embedding, or None (official models condition through the prefix only)."""
        return None

    def _embed_tokens(self, tokens: Tensor, bias: Tensor | None) -> Tensor:
        x = self.tok_embeddings(tokens)
        return x if bias is None else x + bias.to(x.dtype)

    def _positional(self, h: Tensor, slots: Tensor) -> tuple[Tensor, Tensor | None]:
        """Add absolute embeddings or return the rotary table for slots [B, T]."""
        if self.cfg.pos_embed == "abs_pe":
            # Tar's table has no row for the last image slot (never an input there); its output
            # would predict a position past the grid, so any row serves it.
            return h + self.abs_pe[0, slots.clamp(max=self.abs_pe.shape[1] - 1)].to(h.dtype), None
        return h, self.rope_table[slots]

    def positional(self, h: Tensor, slots: Tensor) -> tuple[Tensor, Tensor | None]:
        """The position code of sequence slots [B, T] (prefix_len + image position): `h` [B, T, dim]
        plus the absolute embedding (abs_pe / learned tables), and the rotary table [B, T, hd/2, 2]
        (rope2d) or None. An EAGLE head borrows its target's (harness/models/eagle_head.py)."""
        return self._positional(h, slots)

    def _layers(self, h: Tensor, slots: Tensor, mask: Tensor | None, cache: bool,
                write: Tensor | None = None, raw: bool = False, out: Outputs | None = None,
                eager: bool = False) -> Tensor:
        """h [B, T, dim] at sequence slots [B, T], mask [B, T, S] (None: causal, no cache) -> float
        logits [B, T, V] (in the weights' dtype when `raw`; with `out`, its mix and finish of the
        positions it selects, wide ones projected in chunks: harness/models/chunked_logits.py);
        with `cache`, keys/values go to cache slots `write` [B, T] (default: `slots`), through the
        compiled stack unless `eager`. Keeps the hidden states after the final norm in `last_hidden`."""
        write = slots if write is None else write
        # a static flag (one graph per width): the stack projects unless `out` does it in chunks
        project = out is None or (out.select is None and h.shape[1] <= chunked_logits.LOGITS_CHUNK)
        if cache and not eager:
            logits, self.last_hidden = self._stack(h, slots, mask, write, project)
        elif cache:
            logits, self.last_hidden = self._run_layers(h, slots, mask, write, project)
        else:
            logits, self.last_hidden = self._run_layers(h, slots, mask, None, project)
        if out is None:
            return logits if raw else logits.float()
        return out.of(self.output, logits, self.last_hidden)

    def _run_layers(self, h: Tensor, slots: Tensor, mask: Tensor | None,
                    write: Tensor | None, project: bool = True) -> tuple[Tensor | None, Tensor]:
        """h [B, T, dim] at sequence slots [B, T], mask [B, T, S] or None, cache slots write [B, T]
        or None (no cache) -> (logits [B, T, V] in the weights' dtype, or None without `project`;
        hidden states after the final norm)."""
        h, rope = self._positional(h, slots)
        mask = None if mask is None else mask.unsqueeze(1)  # [B, 1, T, S]: every head
        for layer in self.layers:
            h = layer(h, rope, mask, write)
        hidden = self.norm(h)
        return (self.output(hidden) if project else None), hidden

    def compile_cached(self, mode: str | None = None, name: str = "GPT",
                       budget: int = graphs.GRAPH_BUDGET) -> None:
        """Compile the cached forward's layers (`torch.compile`, one graph per input shape;
        `mode="reduce-overhead"` captures CUDA graphs). Training forwards stay eager. The compiled
        function runs a copy of `_run_layers`' code object made for this model: torch keeps its
        graphs and counts its recompiles per code object, so every model gets `budget` graphs of
        its own (`self.budget` records its shapes and warns past it)."""
        method = type(self)._run_layers
        code = method.__code__.replace(co_name=f"{method.__name__}_{id(self):x}")
        own = types.FunctionType(code, method.__globals__, code.co_name, method.__defaults__, method.__closure__)
        compiled = torch.compile(types.MethodType(own, self), mode=mode, dynamic=False)
        self.budget = graphs.GraphBudget(name, budget)
        if mode == "reduce-overhead":  # a CUDA graph's outputs are overwritten by its next replay
            def stack(*args: Tensor | bool | None) -> tuple[Tensor | None, Tensor]:
                logits, hidden = compiled(*args)
                return (None if logits is None else logits.clone()), hidden.clone()
            self._stack = stack
        else:
            self._stack = compiled
        self.compiled = True

    def _mask_prefix(self, mask: Tensor, slots: Tensor, keep: Tensor) -> Tensor:
        """mask [B, T, S], query slots [B, T], keep [B, P] -> mask with padded prefix columns
        hidden from every query but the slot itself."""
        pad = torch.zeros(keep.shape[0], mask.shape[-1] - keep.shape[1], dtype=torch.bool, device=keep.device)
        return hide(mask, slots, torch.cat([~keep, pad], 1))  # hidden [B, S]: the padded prefix

    # ---------------------------------------------------------------- training
    def forward_train(self, cond: TextCondition, tokens: Tensor, prefix_mask: Tensor | None = None,
                      mask: Tensor | None = None) -> Tensor:
        """Teacher forcing. tokens [B, N] -> logits [B, N, V] where logits[:, i] predicts tokens[:, i].
        prefix_mask [B, P] bool (True = real caption token) or None; mask [B, T, T] bool over the
        T = P + N - 1 input slots (True = attend) or None: slot-causal."""
        feats = self._condition_features(cond)
        images = self._embed_tokens(tokens[:, :-1], self._token_bias(feats))
        x = torch.cat([self._prefix(feats), images], dim=1)  # [B, T = P + N - 1, dim]
        slots = torch.arange(x.shape[1], device=x.device).expand(tokens.shape[0], -1)
        if prefix_mask is not None:
            mask = attention_mask(slots, x.shape[1]) if mask is None else mask
            mask = self._mask_prefix(mask, slots, prefix_mask.to(x.device))
        return self._layers(self.tok_dropout(x), slots, mask, cache=False)[:, self.cfg.prefix_len - 1:]

    # ---------------------------------------------------------------- cached inference
    def setup_cache(self, batch_size: int, dtype: torch.dtype | None = None, scratch: int = 0) -> None:
        """A zeroed static cache for `batch_size` rows, all `slots` and `scratch` more slots after
        them (draft-tree nodes: `forward_cached(..., slots=)`); allocated once per shape and reused
        (KVCache.reuse), like the slot-causal mask table `causal` [S, S] it indexes by slot."""
        if int(scratch) != scratch or scratch < 0:
            raise ValueError(f"scratch slots must be an integer >= 0, got {scratch!r}")
        w = self.output.weight
        self.scratch = int(scratch)
        for layer in self.layers:
            att = layer.attention
            att.kv_cache = KVCache.reuse(att.kv_cache, batch_size, att.n_kv_head, self._kv_slots(att.kv_cache),
                                         att.head_dim, dtype or w.dtype, w.device)
        if self.causal is None or self.causal.shape[0] != self.cache_slots or self.causal.device != w.device:
            with torch.inference_mode(False):
                self.causal = attention_mask(torch.arange(self.cache_slots, device=w.device), self.cache_slots)
        self.prefix_keep = self.token_bias = self.last_hidden = None

    def _kv_slots(self, cache: KVCache | None) -> int:
        """Slots of the cache view: the `cache_slots` eager; compiled, the store's whole width (at
        least one trash slot past `cache_slots`), so that every forward of a batch size sees one
        cache shape whatever the scratch of the decoder."""
        if not self.compiled:
            return self.cache_slots
        return max(self.cache_slots + 1, 0 if cache is None else cache.capacity[1])

    def reserve(self, batch_size: int, scratch: int = 0, dtype: torch.dtype | None = None) -> None:
        """Allocate the cache store once at its largest shape: `batch_size` rows (the job's largest,
        guidance's doubling included) and `scratch` slots (the largest draft tree), plus a compiled
        model's trash slot; later `setup_cache` calls view it without reallocating."""
        self.scratch = 0
        w = self.output.weight
        for layer in self.layers:
            att = layer.attention
            slots = self._kv_slots(None) + int(scratch)
            att.kv_cache = KVCache.reuse(att.kv_cache, batch_size, att.n_kv_head, slots, att.head_dim,
                                         dtype or w.dtype, w.device)

    def prefill(self, cond: TextCondition, prefix_mask: Tensor | None = None) -> Tensor:
        """Write the prefix into slots [0, P); return logits [B, V] for image position 0.
        prefix_mask [B, P] bool (True = real caption token; None = all real) is kept for every
        later forward until the next `setup_cache`/`prefill`: a padded prefix slot is attended
        only by itself (LlamaGen's `emb_masks`)."""
        feats = self._condition_features(cond)
        x = self._prefix(feats)
        self.token_bias = self._token_bias(feats)
        self.prefix_keep = None if prefix_mask is None else prefix_mask.to(x.device, torch.bool)
        slots = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)
        if self.compiled and self.eager_prefill:  # the compiled cache layout, the layers run eager
            kv = self.layers[0].attention.kv_cache.k_cache.shape[2]  # type: ignore[union-attr]
            mask = F.pad(self._causal_rows(slots), (0, kv - self.cache_slots))
            if self.prefix_keep is not None:
                mask = self._mask_prefix(mask, slots, self.prefix_keep)
            return self._layers(x, slots, mask, cache=True, eager=True).float()[:, -1]
        return self._cached(x, slots, self._causal_rows(slots))[:, -1]

    def forward_cached(self, tokens: Tensor, positions: Tensor, mask: Tensor | None = None,
                       slots: Tensor | None = None, raw: bool = False, out: Outputs | None = None) -> Tensor:
        """tokens [B, T] at image positions [T] or [B, T]; mask [B, T, S] bool (True = attend; S =
        `cache_slots`) or None for slot-causal attention; slots [B, T] cache slots to write (None:
        each position's own, prefix_len + position; scratch slots >= `slots` hold draft-tree nodes,
        which keep their positions' rotary/absolute code). Returns float logits [B, T, V] for
        positions + 1 (in the weights' dtype when `raw`; with `out`, its mix and finish of the
        positions it selects, wide ones projected in chunks: harness/models/chunked_logits.py)."""
        b, t = tokens.shape
        seq = positions.to(tokens.device).expand(b, -1) + self.cfg.prefix_len
        write = seq if slots is None else slots.to(tokens.device).expand(b, -1)
        if mask is None:
            mask = self._causal_rows(write)
        elif mask.shape != (b, t, self.cache_slots):
            raise ValueError(f"mask must have shape {(b, t, self.cache_slots)}, got {tuple(mask.shape)}")
        return self._cached(self._embed_tokens(tokens, self.token_bias), seq, mask, write, raw, out)

    def _causal_rows(self, write: Tensor) -> Tensor:
        """Cache slots [B, T] -> the slot-causal mask [B, T, S], rows of the table `causal`."""
        if self.causal is None or self.causal.shape[0] != self.cache_slots:
            raise RuntimeError("KV cache is not set up: call setup_cache(batch_size) first")
        return self.causal[write]

    def _cached(self, x: Tensor, slots: Tensor, mask: Tensor, write: Tensor | None = None,
                raw: bool = False, out: Outputs | None = None) -> Tensor:
        """x [B, T, dim] at sequence slots [B, T] written to cache slots `write` [B, T] (default:
        `slots`), mask [B, T, S] -> logits [B, T, V] (float, or the weights' dtype when `raw`)."""
        write = slots if write is None else write
        if self.prefix_keep is not None:
            mask = self._mask_prefix(mask, write, self.prefix_keep)
        width = graphs.graph_width(x.shape[1])  # the compiled graph's width (eager: recorded only)
        if self.compiled:
            return self._padded(x, slots, mask, write, width, raw, out)
        return self._layers(x, slots, mask, cache=True, write=write, raw=raw, out=out)

    def _padded(self, x: Tensor, slots: Tensor, mask: Tensor, write: Tensor, width: int, raw: bool,
                out: Outputs | None) -> Tensor:
        """The compiled cached forward at `width` >= T tokens: padded positions repeat the last
        position's code, write the cache's last slot (the trash slot, which no real query sees) and
        attend only to it; their outputs are dropped. Masks get False columns up to the cache's
        width (scratch slots of other decoders, the trash slot)."""
        b, t = x.shape[:2]
        kv = self.layers[0].attention.kv_cache.k_cache.shape[2]  # type: ignore[union-attr]
        if kv <= self.cache_slots:
            raise RuntimeError("the cache has no trash slot: call setup_cache after compile_cached")
        first = self.budget is not None and self.budget.note((b, width, kv))
        start = time.perf_counter()
        mask = F.pad(mask, (0, kv - mask.shape[-1]))
        pad = width - t
        if pad:
            x = F.pad(x, (0, 0, 0, pad))
            slots = torch.cat([slots, slots[:, -1:].expand(b, pad)], 1)
            write = torch.cat([write, write.new_full((b, pad), kv - 1)], 1)
            trash = torch.zeros(b, pad, kv, dtype=torch.bool, device=mask.device)
            trash[..., -1] = True
            mask = torch.cat([mask, trash], 1)
        logits = self._layers(x, slots, mask, cache=True, write=write, raw=raw, out=out)
        if first:  # a shape met for the first time: compiled (and captured) in this call
            if logits.is_cuda:
                torch.cuda.synchronize(logits.device)
            self.budget.compile_s += time.perf_counter() - start  # type: ignore[union-attr]
        if pad:
            self.last_hidden = self.last_hidden[:, :t]  # type: ignore[index]
            if out is None or out.select is None:  # selected positions are real ones already
                logits = logits[:, :t]
        return logits

    def move_cache(self, src: Tensor, dst: Tensor) -> None:
        """Copy every layer's cached keys/values of slots src [B, A] to slots dst [B, A], row by row
        (an accepted draft-tree path to its positions' slots). Keys are stored after rotation, and a
        tree node was rotated by its position, so the copy is what re-encoding the path would write."""
        rows = torch.arange(src.shape[0], device=src.device)[:, None]
        for layer in self.layers:
            cache = layer.attention.kv_cache
            if cache is None:
                raise RuntimeError("KV cache is not set up: call setup_cache(batch_size) first")
            cache.move(src, dst, rows)


def causal_mask(positions: Tensor, prefix_len: int, slots: int) -> Tensor:
    """The default mask as an explicit tensor: image positions [B, T] -> [B, T, S] bool."""
    return attention_mask(positions + prefix_len, slots)


def randomise_head(gpt: GPT, seed: int) -> GPT:
    """Official init zeroes the output head; random test models need non-trivial logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        gpt.output.weight.copy_(torch.randn(gpt.output.weight.shape, generator=g) * 0.5 / gpt.cfg.dim**0.5)
    return gpt
