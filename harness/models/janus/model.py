"""`JanusImageModel`: Janus-Pro's image generation path as an ARImageModel, over the modules of a
transformers `JanusForConditionalGeneration`.

The language model's layers run here, one cached attention loop over their own weights
(`input_layernorm`, `self_attn.{q,k,v,o}_proj`, the rotary embedding, `post_attention_layernorm`,
`mlp`, the final `norm`), so that the harness contract holds: a static KV cache allocated once
(harness/models/transformer.KVCache), writes at any slots (rollback = overwrite), any width, explicit
boolean masks [B, T, S] (draft trees, MuLo-SD islands). What enters and leaves the layers is
Janus's generation path, as `generate(generation_mode="image")` uses it:

- prefix: the chat-formatted prompt's token ids through the LLM's `embed_tokens`;
- image token: `generation_embeddings` (16384 x 8) -> `generation_aligner` (MLP to the LLM width);
- logits: `generation_head` (proj_out -> GELU -> vision_head, 16384-way) on the final-norm state.

EAGLE heads (harness/models/eagle_head.py) read `hidden`, `positional` (a 1-D rotary table of the
rotary positions of harness slots), `head_logits` (the generation head), `head_spec` and
`eagle_head` (the head the bundle attached, or None).

Cache slots: `prefix_len` prompt slots (left-padded; a padded slot is seen by no other query), then
image raster position i at slot `prefix_len + i`. Rotary positions count from each row's first prompt
token (padding takes none), so a row computes what transformers computes for its prompt alone: the
prompt at 0 .. L-1, image token i at L + i.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.models.eagle_head import TargetSpec, text_model_spec
from harness.models.janus.condition import PromptIds
from harness.models.masks import attention_mask, hide
from harness.models.llama_layers import rotary, run_layers
from harness.models.transformer import KVCache, rope_1d_table
from harness.models.own_rows import OwnRows


class JanusImageModel(OwnRows, nn.Module):
    """ARImageModel over `hf` (a JanusForConditionalGeneration) at its fixed grid.

    Args:
        hf: the transformers model (its understanding tower is loaded but unused).
        prefix_len: prompt slots P of the cache (prompts are left-padded to it).
    """

    raw_logits = False  # forward returns float logits (guidance mixes them as they are)

    def __init__(self, hf: nn.Module, prefix_len: int) -> None:
        super().__init__()
        self.hf = hf
        side = int(hf.config.vq_config.num_patches)  # image_size // patch_size: 24 at 384 px
        if side * side != int(hf.config.vision_config.num_image_tokens):
            raise ValueError(f"the Janus config has num_image_tokens={hf.config.vision_config.num_image_tokens},"
                             f" not {side}x{side} (image_size / patch_size)")
        self.grid = (side, side)
        self.vocab_size = int(hf.config.vq_config.num_embeddings)
        self.prefix_len = int(prefix_len)
        text = hf.config.text_config
        self.n_head, self.n_kv_head = int(text.num_attention_heads), int(text.num_key_value_heads)
        self.head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)
        self.image_size = int(hf.config.vision_config.image_size)
        self.caches: list[KVCache | None] = [None] * len(self.layers)
        self.scratch = 0
        self.causal: Tensor | None = None  # [S, S] slot-causal table (setup_cache)
        self.keep: Tensor | None = None  # [B, P] prompt (True) / padding slots of the cached rows
        self.offset: Tensor | None = None  # [B] padding slots of each cached row (rotary shift)
        self.last_hidden: Tensor | None = None  # [B, T, dim] after the final norm, last forward
        self.eagle_head: nn.Module | None = None
        self._rope = rotary("llama")  # rotate-half rotary embedding

    # ---------------------------------------------------------------- properties
    @property
    def device(self) -> torch.device:
        return self.hf.model.generation_head.vision_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.hf.model.generation_head.vision_head.weight.dtype

    @property
    def guidance_dtype(self) -> torch.dtype:
        """The dtype CFG is mixed in (harness/models/guidance.py): the gen head's, as transformers'
        Janus generate mixes its scores (the float logits returned here are those values, cast
        exactly, so the mix sees the same numbers)."""
        return self.dtype

    @property
    def layers(self) -> nn.ModuleList:
        """The language model's decoder layers (a property: registered once, under `hf`)."""
        return self.hf.model.language_model.layers

    @property
    def slots(self) -> int:
        return self.prefix_len + self.grid[0] * self.grid[1]

    @property
    def cache_len(self) -> int:
        """S = prefix_len + rows*cols, as every model of the contract; a draft tree's scratch slots
        follow at S .. S + scratch - 1 (`total`), as the GPT's do."""
        return self.slots

    @property
    def total(self) -> int:
        """Cache slots allocated: S plus the scratch slots of the last `setup_cache`."""
        return self.slots + self.scratch

    @property
    def raw_codebook(self) -> Tensor:
        """[V, 8] the VQ codes as stored (float32)."""
        return self.hf.model.vqmodel.quantize.embedding.weight.float()

    @property
    def token_embeddings(self) -> Tensor:
        """[V, dim] the LLM input of each image code (generation embedding -> aligner): the space
        GSD measures its groups in."""
        codes = torch.arange(self.raw_codebook.shape[0], device=self.raw_codebook.device)
        return self.hf.prepare_embeddings_for_image_generation(codes)

    @property
    def codebook(self) -> Tensor:
        """[V, 8] l2-normalised codes (Janus's decoder normalises them, `get_codebook_entry`)."""
        return F.normalize(self.raw_codebook, dim=-1)

    @property
    def hidden(self) -> Tensor | None:
        return self.last_hidden


    @property
    def head_spec(self) -> TargetSpec:
        """What an EAGLE head for this model must match (harness/models/eagle_head.check_compatible)."""
        return text_model_spec(self)

    def positional(self, h: Tensor, slots: Tensor) -> tuple[Tensor, Tensor]:
        """Sequence slots [R, T] -> (h unchanged, the 1-D rotary table [R, T, hd/2, 2] of their rotary
        positions: slot minus the row's padding, the frequencies of the LLM's rotary embedding)."""
        if self.offset is None:
            raise RuntimeError("prefill the prompt before the EAGLE head runs")
        positions = (slots - self.offset[:, None].to(slots.device)).clamp(min=0)
        return h, rope_1d_table(positions, self.hf.model.language_model.rotary_emb.inv_freq)

    def head_logits(self, h: Tensor) -> Tensor:
        """Features h [R, T, dim] -> float logits [R, T, V] through the generation head."""
        return self.hf.model.generation_head(h.to(self.dtype)).float()


    # ---------------------------------------------------------------- cache
    @torch.inference_mode()
    def setup_cache(self, batch_size: int, scratch: int = 0) -> None:
        """A zeroed static cache per layer [batch, Hkv, S, hd], allocated once per shape and reused."""
        if int(scratch) != scratch or scratch < 0:
            raise ValueError(f"scratch slots must be an integer >= 0, got {scratch!r}")
        self.scratch = int(scratch)
        self.caches = [KVCache.reuse(c, batch_size, self.n_kv_head, self.total, self.head_dim, self.dtype,
                                     self.device) for c in self.caches]
        if self.causal is None or self.causal.shape[0] != self.total or self.causal.device != self.device:
            self.causal = attention_mask(torch.arange(self.total, device=self.device), self.total)
        self.keep = self.offset = self.last_hidden = None

    @torch.inference_mode()
    def move_cache(self, src: Tensor, dst: Tensor) -> None:
        """Copy cache slots src [B, A] to dst [B, A] in every layer (an accepted draft-tree path)."""
        rows = torch.arange(src.shape[0], device=self.device)[:, None]
        for cache in self.caches:
            if cache is None:
                raise RuntimeError("KV cache is not set up: call setup_cache(batch_size) first")
            cache.move(src.to(self.device), dst.to(self.device), rows)

    # ---------------------------------------------------------------- forwards
    @torch.inference_mode()
    def prefill(self, cond: PromptIds) -> Tensor:
        """Prompt ids [B, P] into slots [0, P); logits [B, V] for image position 0."""
        if cond.ids.shape[1] != self.prefix_len:
            raise ValueError(f"the condition has {cond.ids.shape[1]} prompt slots, the model {self.prefix_len}")
        if self.causal is None:
            raise RuntimeError("KV cache is not set up: call setup_cache(batch_size) first")
        cond = cond.to(self.device)
        self.keep = cond.keep
        self.offset = (~cond.keep).sum(1)  # left padding: each row's first prompt token is position 0
        slots = torch.arange(self.prefix_len, device=self.device).expand(cond.batch_size, -1)
        x = self.hf.model.language_model.embed_tokens(cond.ids)
        return self._run(x, slots, self.causal[slots], slots)[:, -1]

    @torch.inference_mode()
    def forward(self, tokens: Tensor, positions: Tensor, mask: Tensor | None = None,  # type: ignore[override]
                slots: Tensor | None = None) -> Tensor:
        """tokens [B, T] at image positions [T] or [B, T] -> float logits [B, T, V] for positions + 1;
        mask [B, T, S] bool (None: slot-causal); slots [B, T] cache slots to write (None: each
        position's own; scratch slots hold draft-tree nodes, which keep their positions' rotation)."""
        tokens = tokens.to(self.device)
        b, t = tokens.shape
        seq = positions.to(self.device).expand(b, -1) + self.prefix_len
        write = seq if slots is None else slots.to(self.device).expand(b, -1)
        if self.causal is None:
            raise RuntimeError("KV cache is not set up: call setup_cache(batch_size) first")
        if mask is None:
            mask = self.causal[write]
        elif mask.shape != (b, t, self.total):
            raise ValueError(f"mask must have shape {(b, t, self.total)} (S = {self.cache_len} slots + "
                             f"{self.scratch} scratch), got {tuple(mask.shape)}")
        x = self.hf.prepare_embeddings_for_image_generation(tokens)  # gen_embed -> gen_aligner
        return self._run(x, seq, mask.to(self.device), write)

    def _run(self, x: Tensor, seq: Tensor, mask: Tensor, write: Tensor) -> Tensor:
        """x [B, T, dim] at sequence slots seq [B, T], written to cache slots write [B, T], mask
        [B, T, S] -> float logits [B, T, V] through the generation head."""
        if self.keep is None or self.offset is None:
            raise RuntimeError("prefill the prompt before image forwards")
        pad = F.pad(~self.keep, (0, mask.shape[-1] - self.keep.shape[1]))  # [B, S]: the padded prompt slots
        mask = hide(mask, write, pad)  # a padded slot is seen only by itself
        positions = (seq - self.offset[:, None]).clamp(min=0)  # rotary positions [B, T]
        lm = self.hf.model.language_model
        cos, sin = lm.rotary_emb(x, positions)
        h = run_layers(self.layers, self.caches, x, cos, sin, mask, write,
                       (self.n_head, self.n_kv_head, self.head_dim), self._rope)
        hidden = lm.norm(h)
        self.last_hidden = hidden
        return self.hf.model.generation_head(hidden).float()

    # ---------------------------------------------------------------- pixels
    @torch.inference_mode()
    def decode(self, tokens: Tensor) -> Tensor:
        """tokens [B, rows*cols] -> images [B, 3, H, W] uint8: `decode_image_tokens` in [-1, 1],
        then (x + 1) / 2 * 255 clipped and truncated, as Janus's generation_inference.py."""
        pixels = self.hf.decode_image_tokens(tokens.to(self.device).long())  # [B, H, W, 3]
        return ((pixels.float() + 1) / 2 * 255).clamp(0, 255).to(torch.uint8).permute(0, 3, 1, 2)

    @torch.inference_mode()
    def encode(self, images: Tensor) -> Tensor:
        """images [B, 3, H, W] uint8 -> tokens [B, rows*cols] through the VQ encoder."""
        side = self.image_size
        if tuple(images.shape[2:]) != (side, side):
            raise ValueError(f"images of size {tuple(images.shape[2:])}: this model encodes {side}x{side} px")
        pixels = images.to(self.device, self.dtype) / 127.5 - 1
        return self.hf.model.vqmodel.encode(pixels).image_tokens.view(images.shape[0], -1)
