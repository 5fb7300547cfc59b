"""A LlamaGen-style decoder-only transformer with a static, position-indexed KV cache.

Parameter names and shapes follow LlamaGen's `autoregressive/models/gpt.py` (`tok_embeddings`,
`layers.{i}.attention.wqkv`, `layers.{i}.feed_forward.w1/w2/w3`, `cls_embedding.cap_proj.fc1/fc2`,
`cls_embedding.uncond_embedding`, `norm`, `output`) so that official checkpoints load strictly.

Sequence layout (cache slots): `prefix_len` condition slots, then one slot per image token:
image raster position i lives in slot `prefix_len + i`. The output at slot s predicts the token of
the next slot, so the last prefix slot predicts image position 0.

Official-checkpoint options (defaults keep the original behaviour): `prefix_rope="zero"` gives the
prefix slots LlamaGen's all-zero rotary table (their queries and keys are zeroed, as in LlamaGen's
`precompute_freqs_cis_2d`); `cond_embed="linear"` is Tar AR-DTok's `clip_proj` (a biased linear
map; unconditional rows are zero features); `pos_embed="abs_pe"` is Tar AR-DTok's learned absolute
table `abs_pe` [1, L, dim]; `prefill(cond, prefix_mask)` applies LlamaGen's caption padding mask
(a padded prefix slot is seen only by itself) to every later forward.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.models.condition import TextCondition


@dataclass(frozen=True)
class GPTConfig:
    """Architecture of one GPT. `grid` is (rows, cols) of image tokens."""

    vocab_size: int
    grid: tuple[int, int]
    dim: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_kv_head: int | None = None
    multiple_of: int = 64
    ffn_dim_multiplier: float | None = None
    norm_eps: float = 1e-5
    rope_base: float = 10000.0
    pos_embed: str = "rope2d"  # "rope2d" (LlamaGen), "learned" ([S, dim]) or "abs_pe" (Tar AR-DTok)
    pos_embed_len: int | None = None  # rows of `abs_pe` (None: prefix_len + n_tokens - 1, as Tar)
    prefix_rope: str = "identity"  # rotary table of the prefix slots: "identity" | "zero" (LlamaGen)
    # Fraction of each head's dimension pairs that rotate (LlamaGen: all). The other pairs carry no
    # position for any slot, so with prefix_rope "zero" an image query can still pick caption slots
    # by content there (with all pairs zeroed it sees the caption as one uniform average).
    rope_fraction: float = 1.0
    cond_embed: str = "caption_mlp"  # "caption_mlp" (LlamaGen cls_embedding) | "linear" (Tar clip_proj)
    prefix_len: int = 16  # condition tokens (LlamaGen's cls_token_num)
    caption_dim: int = 64  # width of the condition features fed to cls_embedding
    word_vocab: int = 0  # > 0: the model owns a word embedding (captions given as word ids)
    # True (with word_vocab): a learned embedding per caption slot [prefix_len, caption_dim] is added
    # to the word embeddings. Word ids carry no order by themselves (a real text encoder's features
    # do), and with prefix_rope "zero" "a red circle and a blue square" and "a blue circle and a red
    # square" are the same bag of words. Zero at initialisation.
    word_pos: bool = False
    # True: the whole caption, flattened and projected to one vector [dim], is also added to every
    # image token's input embedding, so each position reads the caption without attention (the
    # shapes world's models; official checkpoints condition through the prefix only).
    cond_broadcast: bool = False
    dropout: float = 0.0
    cond_dropout: float = 0.1  # probability of the unconditional embedding in training (CFG)

    def __post_init__(self) -> None:
        if self.pos_embed not in ("rope2d", "learned", "abs_pe"):
            raise ValueError(f"pos_embed must be 'rope2d', 'learned' or 'abs_pe', got {self.pos_embed!r}")
        if self.prefix_rope not in ("identity", "zero"):
            raise ValueError(f"prefix_rope must be 'identity' or 'zero', got {self.prefix_rope!r}")
        if self.cond_embed not in ("caption_mlp", "linear"):
            raise ValueError(f"cond_embed must be 'caption_mlp' or 'linear', got {self.cond_embed!r}")
        if self.word_pos and self.word_vocab <= 0:
            raise ValueError("word_pos needs word-id captions (word_vocab > 0)")
        if self.dim % self.n_head:
            raise ValueError(f"dim {self.dim} is not divisible by n_head {self.n_head}")
        rotary = self.head_dim // 2 * self.rope_fraction
        if not 0 < self.rope_fraction <= 1 or rotary != int(rotary) or int(rotary) % 2:
            raise ValueError(f"rope_fraction {self.rope_fraction} must be in (0, 1] and rotate an even number "
                             f"of the {self.head_dim // 2} dimension pairs of a head")

    @property
    def n_tokens(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head


def _find_multiple(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - n % k


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight


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
    """Condition features [B, P, caption_dim] -> prefix embeddings [B, P, dim]; rows flagged null
    use the learned unconditional embedding instead (classifier-free guidance)."""

    def __init__(self, caption_dim: int, dim: int, prefix_len: int) -> None:
        super().__init__()
        self.cap_proj = MLP(caption_dim, dim, dim)
        self.register_buffer("uncond_embedding", torch.randn(prefix_len, caption_dim) / caption_dim**0.5)

    def with_null(self, features: Tensor, null: Tensor) -> Tensor:
        """features [B, P, caption_dim] with the rows flagged in null [B] replaced by the
        unconditional embedding."""
        return torch.where(null[:, None, None], self.uncond_embedding.to(features.dtype), features)

    def forward(self, features: Tensor) -> Tensor:
        """Features (null rows already replaced, `with_null`) -> prefix embeddings [B, P, dim]."""
        return self.cap_proj(features)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        hidden = int(2 * 4 * cfg.dim / 3)
        if cfg.ffn_dim_multiplier is not None:
            hidden = int(cfg.ffn_dim_multiplier * hidden)
        hidden = _find_multiple(hidden, cfg.multiple_of)
        self.w1 = nn.Linear(cfg.dim, hidden, bias=False)
        self.w3 = nn.Linear(cfg.dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, cfg.dim, bias=False)
        self.ffn_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.ffn_dropout(self.w2(F.silu(self.w1(x)) * self.w3(x)))


def rope_2d_table(grid: tuple[int, int], head_dim: int, base: float, prefix_len: int,
                  prefix: str = "identity", fraction: float = 1.0) -> Tensor:
    """Rotation table [prefix_len + rows*cols, head_dim/2, 2] (cos, sin). Of the first
    `fraction` of the dimension pairs, half encode the row and half the column (LlamaGen's layout
    when fraction = 1); the remaining pairs never rotate. Prefix slots get no rotation
    (`prefix="identity"`) or LlamaGen's zero table on the rotating pairs (`prefix="zero"`: those
    parts of prefix queries/keys vanish)."""
    pairs = head_dim // 2
    half = int(pairs * fraction)
    freqs = 1.0 / (base ** (torch.arange(0, half, 2)[: half // 2].float() / half))  # [half/2]
    rows = torch.outer(torch.arange(grid[0]).float(), freqs)  # [R, half/2]
    cols = torch.outer(torch.arange(grid[1]).float(), freqs)  # [C, half/2]
    angles = torch.cat(
        [rows[:, None, :].expand(-1, grid[1], -1), cols[None, :, :].expand(grid[0], -1, -1)], dim=-1
    ).flatten(0, 1)  # [R*C, half]
    angles = torch.cat([angles, torch.zeros(angles.shape[0], pairs - half)], dim=-1)  # [R*C, pairs]
    table = torch.stack([angles.cos(), angles.sin()], dim=-1)
    cos0 = torch.ones(prefix_len, pairs)
    if prefix == "zero":
        cos0[:, :half] = 0.0
    return torch.cat([torch.stack([cos0, torch.zeros(prefix_len, pairs)], dim=-1), table])


def apply_rope(x: Tensor, table: Tensor) -> Tensor:
    """x [B, T, H, hd], table [B, T, hd/2, 2] -> x rotated pairwise (x0, x1) by (cos, sin)."""
    xs = x.float().reshape(*x.shape[:-1], -1, 2)
    cos, sin = table[:, :, None, :, 0], table[:, :, None, :, 1]
    out = torch.stack([xs[..., 0] * cos - xs[..., 1] * sin, xs[..., 1] * cos + xs[..., 0] * sin], -1)
    return out.flatten(3).type_as(x)


class KVCache(nn.Module):
    """Static cache [B, H_kv, S, hd]; `write` puts keys/values at per-row slots [B, T]."""

    def __init__(self, batch: int, n_kv_head: int, slots: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        super().__init__()
        shape = (batch, n_kv_head, slots, head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def write(self, slots: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """slots [B, T]; k, v [B, H_kv, T, hd]. Returns the full caches (views, not copies)."""
        rows = torch.arange(k.shape[0], device=k.device)[:, None].expand_as(slots)
        # Index the slot axis through a transposed view so each batch row writes its own slots.
        self.k_cache.transpose(1, 2)[rows, slots] = k.transpose(1, 2).to(self.k_cache.dtype)
        self.v_cache.transpose(1, 2)[rows, slots] = v.transpose(1, 2).to(self.v_cache.dtype)
        return self.k_cache, self.v_cache


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.n_kv_head = cfg.n_kv_head or cfg.n_head
        self.head_dim = cfg.head_dim
        self.wqkv = nn.Linear(cfg.dim, (self.n_head + 2 * self.n_kv_head) * self.head_dim, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.kv_cache: KVCache | None = None

    def forward(self, x: Tensor, rope: Tensor | None, mask: Tensor | None, slots: Tensor | None) -> Tensor:
        """x [B, T, dim]; rope [B, T, hd/2, 2] or None; mask [B, 1, T, S] bool or None (causal,
        no cache); slots [B, T] cache slots to write, or None (training: no cache)."""
        b, t, _ = x.shape
        kv = self.n_kv_head * self.head_dim
        q, k, v = self.wqkv(x).split([self.n_head * self.head_dim, kv, kv], dim=-1)
        q = q.view(b, t, self.n_head, self.head_dim)
        k = k.view(b, t, self.n_kv_head, self.head_dim)
        v = v.view(b, t, self.n_kv_head, self.head_dim)
        if rope is not None:
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if slots is not None:
            if self.kv_cache is None:
                raise RuntimeError("KV cache is not set up: call setup_cache(batch_size) first")
            k, v = self.kv_cache.write(slots, k, v)
            k, v = k.to(q.dtype), v.to(q.dtype)
        if self.n_kv_head != self.n_head:
            k = k.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
            v = v.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        return self.resid_dropout(self.wo(out.transpose(1, 2).reshape(b, t, -1)))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.attention = Attention(cfg)
        self.feed_forward = FeedForward(cfg)
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)

    def forward(self, x: Tensor, rope: Tensor | None, mask: Tensor | None, slots: Tensor | None) -> Tensor:
        h = x + self.attention(self.attention_norm(x), rope, mask, slots)
        return h + self.feed_forward(self.ffn_norm(h))


class GPT(nn.Module):
    """Text-conditioned AR transformer over image tokens (training and cached inference)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        if cfg.word_vocab > 0:
            self.word_embeddings = nn.Embedding(cfg.word_vocab, cfg.caption_dim)
        if cfg.word_pos:
            self.word_pos = nn.Parameter(torch.zeros(cfg.prefix_len, cfg.caption_dim))
        if cfg.cond_embed == "linear":
            self.clip_proj = nn.Linear(cfg.caption_dim, cfg.dim)
        else:
            self.cls_embedding = CaptionEmbedder(cfg.caption_dim, cfg.dim, cfg.prefix_len)
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        if cfg.cond_broadcast:
            self.cond_broadcast = nn.Linear(cfg.prefix_len * cfg.caption_dim, cfg.dim)
        self.tok_dropout = nn.Dropout(cfg.dropout)
        if cfg.pos_embed == "learned":
            self.pos_embedding = nn.Parameter(torch.zeros(cfg.prefix_len + cfg.n_tokens, cfg.dim))
        elif cfg.pos_embed == "abs_pe":
            rows = cfg.pos_embed_len or cfg.prefix_len + cfg.n_tokens - 1
            self.abs_pe = nn.Parameter(torch.zeros(1, rows, cfg.dim))
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        table = rope_2d_table(cfg.grid, cfg.head_dim, cfg.rope_base, cfg.prefix_len, cfg.prefix_rope,
                              cfg.rope_fraction)
        self.register_buffer("rope_table", table, persistent=False)
        self.prefix_keep: Tensor | None = None  # [B, P] bool caption padding mask of the cached rows
        self.cond_bias: Tensor | None = None  # [B, 1, dim] broadcast condition of the cached rows
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
        nn.init.zeros_(self.output.weight)

    # ---------------------------------------------------------------- embeddings
    @property
    def slots(self) -> int:
        return self.cfg.prefix_len + self.cfg.n_tokens

    def _condition_features(self, cond: TextCondition) -> Tensor:
        """Condition -> features [B, P, caption_dim] (null rows: zeros, or the learned
        unconditional embedding of the caption MLP)."""
        given = (cond.features if cond.ids is None else cond.ids).shape[1]
        if given != self.cfg.prefix_len:
            raise ValueError(f"condition has {given} tokens, the model expects {self.cfg.prefix_len}")
        feats = cond.features if cond.ids is None else self._words(cond.ids)
        if self.cfg.cond_embed == "linear":
            return torch.where(cond.null[:, None, None], torch.zeros_like(feats), feats)
        return self.cls_embedding.with_null(feats, cond.null)

    def _words(self, ids: Tensor) -> Tensor:
        """Word ids [B, P] -> features [B, P, caption_dim] (+ the slot embedding with word_pos)."""
        feats = self.word_embeddings(ids)
        return feats + self.word_pos if self.cfg.word_pos else feats

    def prefix_embeddings(self, cond: TextCondition) -> Tensor:
        """Condition -> prefix embeddings [B, P, dim]."""
        return self._prefix(self._condition_features(cond))

    def _prefix(self, feats: Tensor) -> Tensor:
        if self.cfg.cond_embed == "linear":
            return self.clip_proj(feats.to(self.clip_proj.weight.dtype))
        return self.cls_embedding(feats)

    def _broadcast(self, feats: Tensor) -> Tensor | None:
        """features [B, P, caption_dim] -> the per-image-token condition [B, 1, dim], or None."""
        if not self.cfg.cond_broadcast:
            return None
        return self.cond_broadcast(feats.flatten(1).to(self.cond_broadcast.weight.dtype))[:, None]

    def _embed_tokens(self, tokens: Tensor, bias: Tensor | None) -> Tensor:
        x = self.tok_embeddings(tokens)
        return x if bias is None else x + bias.to(x.dtype)

    def _positional(self, h: Tensor, slots: Tensor) -> tuple[Tensor, Tensor | None]:
        """Add absolute embeddings or return the rotary table for slots [B, T]."""
        if self.cfg.pos_embed == "learned":
            return h + self.pos_embedding[slots].to(h.dtype), None
        if self.cfg.pos_embed == "abs_pe":
            # Tar's table has no row for the last image slot (never an input there); its output
            # would predict a position past the grid, so any row serves it.
            return h + self.abs_pe[0, slots.clamp(max=self.abs_pe.shape[1] - 1)].to(h.dtype), None
        return h, self.rope_table[slots]

    def _head(self, h: Tensor) -> Tensor:
        return self.output(self.norm(h)).float()

    # ---------------------------------------------------------------- training
    def forward_train(self, cond: TextCondition, tokens: Tensor, prefix_mask: Tensor | None = None,
                      hidden: Tensor | None = None) -> Tensor:
        """Teacher forcing. tokens [B, N] -> logits [B, N, V] where logits[:, i] predicts tokens[:, i].
        prefix_mask [B, P] bool (True = real caption token) or None; hidden [B, N, N] bool or None:
        hidden[b, i, j] hides token j from the prediction of token i (on top of the causal mask;
        harness/shapes/parallel_masks.py)."""
        b, n = tokens.shape
        feats = self._condition_features(cond)
        x = torch.cat([self._prefix(feats), self._embed_tokens(tokens[:, :-1], self._broadcast(feats))], dim=1)
        slots = torch.arange(x.shape[1], device=x.device).expand(b, -1)
        mask = None
        if prefix_mask is not None or hidden is not None:
            mask = slots[:, :, None] >= torch.arange(x.shape[1], device=x.device)  # [B, T, T]
        if hidden is not None:
            if hidden.shape != (b, n, n):
                raise ValueError(f"hidden must have shape {(b, n, n)}, got {tuple(hidden.shape)}")
            p = self.cfg.prefix_len
            # the query predicting token i sits on slot p - 1 + i; token j sits on slot p + j
            mask[:, p - 1:, p:] &= ~hidden[:, :, :n - 1].to(x.device)
        if prefix_mask is not None:
            mask = self._mask_prefix(mask, slots, prefix_mask.to(x.device))
        if mask is not None:
            mask = mask.unsqueeze(1)
        h, rope = self._positional(self.tok_dropout(x), slots)
        for layer in self.layers:
            h = layer(h, rope, mask, None)
        return self._head(h[:, self.cfg.prefix_len - 1:])

    # ---------------------------------------------------------------- cached inference
    def setup_cache(self, batch_size: int, dtype: torch.dtype | None = None) -> None:
        """Allocate a zeroed static cache for `batch_size` rows and all `slots`."""
        p = self.output.weight
        for layer in self.layers:
            att = layer.attention
            att.kv_cache = KVCache(batch_size, att.n_kv_head, self.slots, att.head_dim, dtype or p.dtype, p.device)
        self.prefix_keep = None
        self.cond_bias = None

    def prefill(self, cond: TextCondition, prefix_mask: Tensor | None = None) -> Tensor:
        """Write the prefix into slots [0, P); return logits [B, V] for image position 0.
        prefix_mask [B, P] bool (True = real caption token; None = all real) is kept for every
        later forward until the next `setup_cache`/`prefill`: a padded prefix slot is attended
        only by itself (LlamaGen's `emb_masks`)."""
        feats = self._condition_features(cond)
        x = self._prefix(feats)
        self.cond_bias = self._broadcast(feats)
        b, p = x.shape[:2]
        self.prefix_keep = None if prefix_mask is None else prefix_mask.to(x.device, torch.bool)
        slots = torch.arange(p, device=x.device).expand(b, -1)
        mask = slots[:, :, None] >= torch.arange(self.slots, device=x.device)
        return self._run(x, slots, mask.unsqueeze(1))[:, -1]

    def _mask_prefix(self, mask: Tensor, slots: Tensor, keep: Tensor) -> Tensor:
        """mask [B, T, S], query slots [B, T], keep [B, P] -> mask with padded prefix columns
        hidden from every query but the slot itself."""
        p = keep.shape[1]
        own = slots[:, :, None] == torch.arange(p, device=mask.device)
        prefix = mask[:, :, :p] & (keep[:, None, :] | own)
        return torch.cat([prefix, mask[:, :, p:]], dim=-1)

    def forward_cached(self, tokens: Tensor, positions: Tensor, mask: Tensor | None = None) -> Tensor:
        """tokens [B, T] at image positions [T] or [B, T]; mask [B, T, S] bool (True = attend) or
        None for slot-causal attention. Returns logits [B, T, V] for positions + 1."""
        b, t = tokens.shape
        if positions.dim() == 1:
            positions = positions.expand(b, -1)
        slots = positions.to(tokens.device) + self.cfg.prefix_len
        if mask is None:
            mask = slots[:, :, None] >= torch.arange(self.slots, device=tokens.device)
        elif mask.shape != (b, t, self.slots):
            raise ValueError(f"mask must have shape {(b, t, self.slots)}, got {tuple(mask.shape)}")
        return self._run(self._embed_tokens(tokens, self.cond_bias), slots, mask.unsqueeze(1))

    def _run(self, x: Tensor, slots: Tensor, mask: Tensor) -> Tensor:
        """x [B, T, dim], slots [B, T], mask [B, 1, T, S] -> logits [B, T, V]."""
        if self.prefix_keep is not None:
            mask = self._mask_prefix(mask[:, 0], slots, self.prefix_keep).unsqueeze(1)
        h, rope = self._positional(x, slots)
        for layer in self.layers:
            h = layer(h, rope, mask, slots)
        return self._head(h)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def causal_mask(positions: Tensor, prefix_len: int, slots: int) -> Tensor:
    """The default mask as an explicit tensor: positions [B, T] -> [B, T, S] bool."""
    q = positions + prefix_len
    return q[:, :, None] >= torch.arange(slots, device=positions.device)

