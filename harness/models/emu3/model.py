"""`Emu3ImageModel`: Emu3's image generation as an ARImageModel, over the modules of a transformers
`Emu3ForConditionalGeneration`, at a token grid chosen at construction (Emu3 generates any size
with one checkpoint: the header in the prompt names the grid).

The text model's layers run here, one cached attention loop over their own weights
(`input_layernorm`, `self_attn.{q,k,v,o}_proj`, the rotary embedding, `post_attention_layernorm`,
`mlp`, the final `norm`), so that the harness contract holds: a static KV cache allocated once
(harness/models/transformer.KVCache), writes at any slots (rollback = overwrite), any width, explicit
boolean masks [B, T, S], scratch slots for draft-tree nodes and `move_cache`.

What the harness sees: `prefix_len` condition slots (the left-padded text and the image header)
followed by `rows * cols` image positions, and `vocab_size` = the VQ codebook (32768). What runs:
transformers' sequence, in which every row is followed by the end-of-row token `<|extra_200|>`
(harness/models/row_ends.SlotMap; the last row's is never an input, the image is complete). The
wrapper hides it, as Lumina-mGPT's does (harness/models/lumina/image_model.py):

* an input at the last position of a row (not the last row) also runs the end-of-row token at the
  row's end-of-row slot, in the same forward, after it; the logits returned for that input (they
  predict the next row's first token) are the end-of-row input's, as in transformers' sequence;
* masks: a harness mask [B, T, S] maps onto the cache slots; the end-of-row token of row r is seen by
  a query iff the query sees row r's last token and comes after it (query position > that token's);
  an end-of-row input sees what its row's last token sees, plus itself. Padded prompt slots are
  hidden from every query;
* draft-tree nodes (scratch slots S .. S + m - 1 of the harness) live in cache slots after the
  sequence and a trash slot; a node at a row's last position writes its end-of-row token to a twin
  scratch slot (m further on), which a query sees iff it sees the node and comes after its position;
  `move_cache` moves a node's twin with it to the row's end-of-row slot;
* logits are the LM head's rows of the image codes (the vocabulary ids `code_ids`, in code order),
  which is what transformers' prefix constraint keeps at an image position;
* rotary positions count from each row's first real token (left padding takes none), so a batch
  row computes what transformers computes for its prompt alone.

EAGLE heads (harness/models/eagle_head.py) read `hidden` (the last forward's final-norm states, an
input ending a row giving its end-of-row token's), `positional` (a 1-D rotary table of the rotary
positions of harness slots, end-of-row tokens counted), `head_logits` (the LM head's image-code
rows), `head_spec` and `eagle_head` (the head the bundle attached, or None).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.models.eagle_head import TargetSpec, text_model_spec
from harness.models.emu3.condition import Emu3Prompt
from harness.models.masks import attention_mask, hide
from harness.models.row_ends import SlotMap, layout_inputs
from harness.models.llama_layers import rotary, run_layers
from harness.models.transformer import KVCache, rope_1d_table
from harness.models.own_rows import OwnRows


class Emu3ImageModel(OwnRows, nn.Module):
    """ARImageModel over `hf` (an Emu3ForConditionalGeneration) at `grid` (rows, cols) tokens.

    Args:
        hf: the transformers model.
        grid: token rows and columns (pixels / the VQ model's spatial factor, 8).
        prompt_slots: text slots of the condition (BOS + prompt, left-padded).
        header_len: the image header's ids for this grid (`<|image start|>{rows}*{cols}<|image token|>`).
        pixel_mean, pixel_std: the image processor's normalisation (pixels = (x * std + mean) * 255).
    """

    raw_logits = False  # forward returns float logits (guidance mixes them as they are)

    def __init__(self, hf: nn.Module, grid: tuple[int, int], prompt_slots: int, header_len: int,
                 pixel_mean: tuple[float, ...] = (0.5, 0.5, 0.5), pixel_std: tuple[float, ...] = (0.5, 0.5, 0.5)) -> None:
        super().__init__()
        self.hf = hf
        self.grid = (int(grid[0]), int(grid[1]))
        self.map = SlotMap(int(prompt_slots) + int(header_len), self.grid)
        self.header_len = int(header_len)
        vocab = hf.vocabulary_mapping
        codes = int(hf.config.vq_config.codebook_size)
        img2bpe = vocab.img2bpe
        if sorted(img2bpe) != list(range(codes)):
            raise ValueError(f"the vocabulary map names {len(img2bpe)} visual tokens, not the codes 0..{codes - 1} "
                             "of the VQ model")
        self.register_buffer("code_ids", torch.tensor([img2bpe[c] for c in range(codes)]), persistent=False)
        self.vocab_size = codes
        self.eol_id = int(vocab.eol_token_id)
        self.pad_id = int(hf.config.text_config.pad_token_id)
        self.spatial = int(hf.model.vqmodel.vision_spatial_factor)
        self.register_buffer("pixel_mean", torch.tensor(pixel_mean).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(pixel_std).view(1, -1, 1, 1), persistent=False)
        text = hf.config.text_config
        self.n_head, self.n_kv_head = int(text.num_attention_heads), int(text.num_key_value_heads)
        self.head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)
        self.caches: list[KVCache | None] = [None] * len(self.layers)
        self.scratch = 0
        self.keep: Tensor | None = None  # [B, R] cache slots any query may see (padding, trash hidden)
        self.offset: Tensor | None = None  # [B] padding slots of each row (rotary shift)
        self.scratch_pos: Tensor | None = None  # [B, scratch] image position written to each scratch slot
        self._head: tuple[Any, Tensor] | None = None  # (weight version key, [V, dim] LM head rows)
        self.hidden: Tensor | None = None  # [B, T, dim] final-norm states of the last forward (EAGLE heads)
        self.eagle_head: nn.Module | None = None
        self._rope = rotary("emu3")  # rotate-half rotary embedding

    # ---------------------------------------------------------------- properties
    @property
    def device(self) -> torch.device:
        return self.hf.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.hf.lm_head.weight.dtype

    @property
    def layers(self) -> nn.ModuleList:
        return self.hf.model.text_model.layers

    @property
    def prefix_len(self) -> int:
        return self.map.prefix

    @property
    def cache_len(self) -> int:
        """S = prefix_len + rows*cols, the contract's; draft-tree scratch slots follow at S .. S + m - 1."""
        return self.map.prefix + self.map.n_tokens

    @property
    def total(self) -> int:
        """Harness slots of the last `setup_cache`: S plus its scratch slots."""
        return self.cache_len + self.scratch

    @property
    def cache_slots(self) -> int:
        """Cache slots allocated: the sequence, the trash slot, scratch nodes and their twins."""
        return self.map.cache_slots(self.scratch)

    @property
    def image_size(self) -> int:
        return max(self.grid) * self.spatial

    @property
    def codebook(self) -> Tensor:
        """[V, embed_dim] the VQ codes (float32)."""
        return self.hf.model.vqmodel.quantize.embedding.weight.float()

    raw_codebook = codebook

    @property
    def token_embeddings(self) -> Tensor:
        """[V, dim] the text model's input embedding of each code (vocabulary ids `code_ids`): the
        space GSD measures its groups in."""
        return self.hf.model.text_model.embed_tokens.weight[self.code_ids]

    @property
    def head_spec(self) -> TargetSpec:
        """What an EAGLE head for this model must match (harness/models/eagle_head.check_compatible)."""
        return text_model_spec(self)



    def positional(self, h: Tensor, slots: Tensor) -> tuple[Tensor, Tensor]:
        """Harness sequence slots [R, T] (< S) -> (h unchanged, the 1-D rotary table [R, T, hd/2, 2]
        of their rotary positions: cache slot, end-of-row tokens counted, minus the row's padding)."""
        if self.offset is None:
            raise RuntimeError("prefill the prompt before the EAGLE head runs")
        positions = (self.map.cache_slot(slots) - self.offset[:, None].to(slots.device)).clamp(min=0)
        return h, rope_1d_table(positions, self.hf.model.text_model.rotary_emb.inv_freq)

    def head_logits(self, h: Tensor) -> Tensor:
        """Features h [R, T, dim] -> float logits [R, T, V] of the image codes (the LM head's rows
        read afresh when h needs gradients: training a head, python -m baselines.training.train_eagle)."""
        if h.requires_grad:
            return F.linear(h.to(self.dtype), self.hf.lm_head.weight[self.code_ids]).float()
        return self._logits(h.to(self.dtype))

    def _head_rows(self) -> Tensor:
        """[V, dim] the LM head's rows of the image codes, sliced once per weight version."""
        weight = self.hf.lm_head.weight
        key = (weight.data_ptr(), weight.device, weight.dtype, weight._version)
        if self._head is None or self._head[0] != key:
            self._head = (key, weight[self.code_ids.to(weight.device)].detach())
        return self._head[1]

    # ---------------------------------------------------------------- slots
    def _slot_mask(self, mask: Tensor, positions: Tensor) -> Tensor:
        """Harness mask [B, T, S + m] of queries at image positions [B, T] -> mask over the cache
        slots [B, T, cache_slots] (row_ends.SlotMap.slot_mask), padded prompt slots hidden."""
        assert self.keep is not None and self.scratch_pos is not None
        return self.map.slot_mask(mask, positions, self.scratch_pos) & self.keep[:, None, :]

    # ---------------------------------------------------------------- cache
    @torch.inference_mode()
    def setup_cache(self, batch_size: int, scratch: int = 0) -> None:
        """A zeroed static cache per layer [batch, Hkv, slots, hd], allocated once per shape and reused."""
        if int(scratch) != scratch or scratch < 0:
            raise ValueError(f"scratch slots must be an integer >= 0, got {scratch!r}")
        self.scratch = int(scratch)
        self.caches = [KVCache.reuse(c, batch_size, self.n_kv_head, self.cache_slots, self.head_dim, self.dtype,
                                     self.device) for c in self.caches]
        self.keep = self.offset = self.hidden = None
        self.scratch_pos = torch.full((batch_size, self.scratch), -1, dtype=torch.long, device=self.device)

    @torch.inference_mode()
    def move_cache(self, src: Tensor, dst: Tensor) -> None:
        """Copy harness slots src [B, A] to dst [B, A] in every layer (an accepted draft-tree path);
        a node moved to a row's last position brings its end-of-row twin to the row's slot."""
        src_all, dst_all = self.map.moves(src.to(self.device), dst.to(self.device), self.scratch)
        rows = torch.arange(src_all.shape[0], device=self.device)[:, None]
        for cache in self.caches:
            if cache is None:
                raise RuntimeError("KV cache is not set up: call setup_cache(batch_size) first")
            cache.move(src_all, dst_all, rows)

    # ---------------------------------------------------------------- forwards
    @torch.inference_mode()
    def prefill(self, cond: Emu3Prompt) -> Tensor:
        """Text + header (negative rows: the negative prompt) into slots [0, prefix); logits [B, V]
        for image position 0."""
        if self.scratch_pos is None:
            raise RuntimeError("KV cache is not set up: call setup_cache(batch_size) first")
        ids, keep = cond.to(self.device).rows(self.grid)
        b, p = ids.shape
        if p != self.map.prefix:
            raise ValueError(f"the condition gives {p} prefix slots for grid {self.grid}, the model {self.map.prefix}")
        self.offset = p - keep.sum(1)
        tail = torch.ones(b, self.cache_slots - p, dtype=torch.bool, device=self.device)
        self.keep = torch.cat([keep, tail], 1)
        self.keep[:, self.map.trash] = False
        slots = torch.arange(p, device=self.device).expand(b, -1)
        mask = hide(attention_mask(slots, self.cache_slots), slots, ~self.keep)
        x = self.hf.model.text_model.embed_tokens(ids)
        self.hidden = self._run(x, slots - self.offset[:, None], mask, slots)
        return self._logits(self.hidden[:, -1])

    @torch.inference_mode()
    def forward(self, tokens: Tensor, positions: Tensor, mask: Tensor | None = None,  # type: ignore[override]
                slots: Tensor | None = None) -> Tensor:
        """tokens [B, T] (VQ codes) at image positions [T] or [B, T] -> float logits [B, T, V] for
        positions + 1; mask [B, T, S + m] bool (None: slot-causal); slots [B, T] harness slots to
        write (None: each position's own; scratch slots S.. hold draft-tree nodes, which keep their
        positions' rotation)."""
        if self.keep is None or self.offset is None or self.scratch_pos is None:
            raise RuntimeError("call setup_cache and prefill before forward")
        inputs = layout_inputs(self, tokens, positions, mask, slots, self.eol_id)
        x = self.hf.model.text_model.embed_tokens(inputs.ids)
        hidden = self._run(x, (inputs.seq - self.offset[:, None]).clamp(min=0), inputs.mask, inputs.write)
        self.hidden = inputs.returned(hidden)
        return self._logits(self.hidden)

    def _logits(self, hidden: Tensor) -> Tensor:
        """Final-norm states [..., dim] -> float logits [..., V] of the image codes."""
        return F.linear(hidden, self._head_rows()).float()

    def _run(self, x: Tensor, positions: Tensor, mask: Tensor, write: Tensor) -> Tensor:
        """x [B, T, dim] at rotary positions [B, T], written to cache slots write [B, T], mask
        [B, T, cache_slots] -> final-norm hidden states [B, T, dim]."""
        text = self.hf.model.text_model
        cos, sin = text.rotary_emb(x, positions)
        h = run_layers(self.layers, self.caches, x, cos, sin, mask, write,
                       (self.n_head, self.n_kv_head, self.head_dim), self._rope)
        return text.norm(h)

    # ---------------------------------------------------------------- pixels
    @torch.inference_mode()
    def decode(self, tokens: Tensor) -> Tensor:
        """codes [B, rows*cols] -> images [B, 3, H, W] uint8: the VQ decoder (what
        `decode_image_tokens` runs after mapping vocabulary ids to codes), then the image
        processor's postprocess: (x * std + mean) * 255, clipped, truncated."""
        codes = tokens.to(self.device).long().view(tokens.shape[0], *self.grid)
        pixels = self.hf.model.vqmodel.decode(codes).float()  # [B, 3, H, W] in about [-1, 1]
        return ((pixels * self.pixel_std + self.pixel_mean) * 255).clamp(0, 255).to(torch.uint8)

    @torch.inference_mode()
    def encode(self, images: Tensor) -> Tensor:
        """images [B, 3, H, W] uint8 -> codes [B, rows*cols] through the VQ encoder."""
        size = (self.grid[0] * self.spatial, self.grid[1] * self.spatial)
        if tuple(images.shape[2:]) != size:
            raise ValueError(f"images of size {tuple(images.shape[2:])}: this model encodes {size[0]}x{size[1]} px")
        vq = self.hf.model.vqmodel
        pixels = ((images.to(self.device).float() / 255 - self.pixel_mean) / self.pixel_std).to(vq.dtype)
        sizes = torch.tensor([size] * images.shape[0])
        codes = vq.encode(pixels, sizes).image_tokens  # a list of [rows, cols]
        return torch.stack(list(codes)).view(images.shape[0], -1)
