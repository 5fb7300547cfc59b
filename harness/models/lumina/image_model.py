"""`LuminaImageModel`: a Chameleon LM laid out as Lumina-mGPT generates, exposed through the
ARImageModel contract (raster grid positions, static cache, logits over the VQGAN's codes, scratch
slots for draft-tree nodes and `move_cache`).

What the harness sees: `prefix_len` condition slots (left-padded prompt, then the 3 header tokens)
followed by `rows * cols` image positions, and `vocab_size` = the VQGAN's codes (8192). What runs:
the official sequence (harness/models/lumina/layout.py), in which every row but the last is followed
by the end-of-row token <eol>. The wrapper hides it:

* an input at the last position of a row (not the last row) also runs <eol> at the row's <eol> slot,
  in the same forward, after it; the logits returned for that input (they predict the next row's
  first token) are the <eol> input's, as in the official sequence;
* masks: a harness mask [B, T, prefix + rows*cols] maps onto the cache slots; the <eol> of row r is
  seen by a query iff the query sees row r's last token and comes after it (query position > that
  token's), and an <eol> input sees what its row's last token sees, plus itself. Padded prompt slots
  are hidden from every query. So draft windows, trees and islands keep their meaning;
* draft-tree nodes (scratch slots S .. S + m - 1 of the harness, S = `cache_len`) live in cache
  slots after the sequence and a trash slot; a node at a row's last position writes its <eol> to a
  twin scratch slot (m further on), which a query sees iff it sees the node and comes after its
  position; `move_cache` moves a node's twin with it to the row's <eol> slot (the mapping is
  harness/models/row_ends.SlotMap's, shared with Emu3). A node keeps its position's rotation;
* logits are the LM head's rows of the 8192 image codes (the official sampler suppresses every
  other id at image positions), in VQGAN code order (`code_ids`: the vocabulary id of each code);
* rotary positions count from each row's first real token (left padding shifts nothing), so a batch
  row computes what it computes alone.

EAGLE heads (harness/models/eagle_head.py, baselines/methods/eagle.py) read `hidden` (the last
forward's final-norm states, an input ending a row giving its <eol>'s state, the one that predicts
the next row's first token), `positional` (a 1-D rotary table of each harness slot's rotary
position: its cache slot, <eol>s counted, minus the row's padding), `head_logits` (the LM head's
image-code rows), `head_spec` and `eagle_head` (the head the bundle attached, or None).

Classifier-free guidance (harness/models/guidance.py doubles the batch): a null row keeps only the
header of its prefix, at rotary positions 0, 1, 2, followed by the same image tokens and <eol>s as
its conditional row. That is the official unbatched CFG: its unconditional context is
`input_ids[:, image_start_index:]` (header, then every generated token, <eol>s included) in a second
model call with its own cache, positions from 0; the mix s * (c - u) + u is element-wise, so mixing
the 8192 image logits equals mixing the 65536 and then suppressing the non-image ids.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.models.lumina.chameleon import ChameleonLM
from harness.models.lumina.layout import HEADER, SpecialTokens, check_header, header
from harness.models.row_ends import SlotMap, layout_inputs
from harness.models.lumina.prompts import ChatCondition
from harness.models.eagle_head import TargetSpec
from harness.models.masks import attention_mask, hide
from harness.models.transformer import rope_1d_table
from harness.models.wrapper import forwarded
from harness.models.own_rows import OwnRows


class LuminaImageModel(OwnRows, nn.Module):
    """ARImageModel over a `grid` of VQGAN codes of an image of `size` (width, height) px."""

    device = forwarded("lm.device")
    codebook = forwarded("tokenizer.codebook")

    def __init__(self, lm: ChameleonLM, tokenizer: nn.Module, size: tuple[int, int], prompt_slots: int,
                 tokens: SpecialTokens, code_ids: Tensor, downsample: int = 16) -> None:
        super().__init__()
        width, height = size
        if width % (2 * downsample) or height % (2 * downsample):
            raise ValueError(f"Lumina-mGPT image sides are multiples of {2 * downsample} px, got {width}x{height}")
        self.lm, self.tokenizer, self.size, self.tokens = lm, tokenizer, (width, height), tokens
        self.grid = (height // downsample, width // downsample)
        self.vocab_size = int(code_ids.numel())
        self.map = SlotMap(prompt_slots + HEADER, self.grid)
        self.header = header(tokens, width, height)
        check_header(tokens, self.header, self.grid)
        self.register_buffer("code_ids", code_ids.long(), persistent=False)
        self.scratch = 0  # harness scratch slots of the last setup_cache (draft-tree nodes)
        self.keep: Tensor | None = None  # [B, cache_slots] bool: slots a query may see (not padding, trash)
        self.offset: Tensor | None = None  # [B] rotary position of slot 0 is -offset
        self.scratch_pos: Tensor | None = None  # [B, scratch] image position written to each scratch slot
        self.hidden: Tensor | None = None  # [B, T, dim] final-norm states of the last forward (EAGLE heads)
        self.eagle_head: nn.Module | None = None

    @property
    def prefix_len(self) -> int:
        return self.map.prefix

    @property
    def token_embeddings(self) -> Tensor:
        """[V, dim] the LM's input embedding of each image code (vocabulary ids `code_ids`): the
        space GSD measures its groups in (its code reads Chameleon's `embed_tokens`)."""
        return self.lm.model.embed_tokens.weight[self.code_ids]

    @property
    def head_spec(self) -> TargetSpec:
        """What an EAGLE head for this model must match (harness/models/eagle_head.check_compatible)."""
        a = self.lm.arch
        return TargetSpec(dim=a.hidden_size, n_head=a.num_attention_heads, n_kv_head=a.num_key_value_heads,
                          vocab_size=self.vocab_size, grid=self.grid, prefix_len=self.prefix_len,
                          ffn_dim=a.intermediate_size)



    def positional(self, h: Tensor, slots: Tensor) -> tuple[Tensor, Tensor]:
        """Harness sequence slots [R, T] (< S) -> (h unchanged, the 1-D rotary table [R, T, hd/2, 2]
        of their rotary positions: cache slot, <eol>s counted, minus the row's padding)."""
        a = self.lm.arch
        inv = 1.0 / (a.rope_theta ** (torch.arange(0, a.head_dim, 2, device=slots.device).float() / a.head_dim))
        return h, rope_1d_table(self._rope(self.map.cache_slot(slots)), inv)

    def head_logits(self, h: Tensor) -> Tensor:
        """Features h [R, T, dim] -> float logits [R, T, V] over the image codes (LM head rows; read
        afresh when h needs gradients: training a head, python -m baselines.training.train_eagle)."""
        if h.requires_grad:
            return F.linear(h.to(self.lm.dtype), self.lm.lm_head.weight[self.code_ids]).float()
        return self.lm.logits(h.to(self.lm.dtype), self.code_ids)

    @property
    def cache_len(self) -> int:
        """S = prefix_len + rows*cols, the contract's; draft-tree scratch slots follow at S .. S + m - 1."""
        return self.map.harness_len

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
        return max(self.size)

    def setup_cache(self, batch_size: int, scratch: int = 0) -> None:
        """A zeroed static cache for `batch_size` rows with `scratch` draft-tree node slots."""
        if int(scratch) != scratch or scratch < 0:
            raise ValueError(f"scratch slots must be an integer >= 0, got {scratch!r}")
        self.scratch = int(scratch)
        self.lm.setup_cache(batch_size, self.cache_slots)
        self.keep = self.offset = self.hidden = None
        self.scratch_pos = torch.full((batch_size, self.scratch), -1, dtype=torch.long, device=self.device)

    @torch.inference_mode()
    def move_cache(self, src: Tensor, dst: Tensor) -> None:
        """Copy harness slots src [B, A] to dst [B, A] in every layer (an accepted draft-tree path);
        a node moved to a row's last position brings its <eol> twin to the row's <eol> slot."""
        self.lm.move_cache(*self.map.moves(src.to(self.device), dst.to(self.device), self.scratch))

    # ---------------------------------------------------------------- prefix
    @torch.inference_mode()
    def prefill(self, cond: ChatCondition) -> Tensor:
        """Write prompt + header into the prefix slots; return logits [B, V] for position 0."""
        if self.scratch_pos is None:
            raise RuntimeError("KV cache is not set up: call setup_cache(batch_size) first")
        ids, keep = cond.to(self.device).rows(self.size)
        b, p = ids.shape
        head = torch.tensor(self.header, device=self.device).expand(b, -1)
        ids = torch.cat([ids, head], 1)  # [B, prefix]
        keep = torch.cat([keep, torch.ones(b, HEADER, dtype=torch.bool, device=self.device)], 1)
        self.offset = self.map.prefix - keep.sum(1)  # padding slots before the first real token
        tail = torch.ones(b, self.cache_slots - self.map.prefix, dtype=torch.bool, device=self.device)
        self.keep = torch.cat([keep, tail], 1)
        self.keep[:, self.map.trash] = False
        slots = torch.arange(self.map.prefix, device=self.device).expand(b, -1)
        mask = hide(attention_mask(slots, self.cache_slots), slots, ~self.keep)
        hidden = self.lm.hidden(ids, self._rope(slots), mask, slots)
        self.hidden = hidden
        return self.lm.logits(hidden[:, -1], self.code_ids)

    def _rope(self, slots: Tensor) -> Tensor:
        """Cache slots [B, T] -> rotary positions [B, T] (each row counts from its first real token)."""
        assert self.offset is not None, "prefill first"
        return (slots - self.offset[:, None]).clamp(min=0)

    # ---------------------------------------------------------------- image positions
    def _slot_mask(self, mask: Tensor, positions: Tensor) -> Tensor:
        """Harness mask [B, T, S + m] of queries at image positions [B, T] -> mask over the cache
        slots [B, T, cache_slots] (see the module docstring), padded prompt slots hidden."""
        assert self.keep is not None and self.scratch_pos is not None
        return self.map.slot_mask(mask, positions, self.scratch_pos) & self.keep[:, None, :]

    @torch.inference_mode()
    def forward(self, tokens: Tensor, positions: Tensor, mask: Tensor | None = None,  # type: ignore[override]
                slots: Tensor | None = None) -> Tensor:
        """tokens [B, T] (VQGAN codes) at image positions [T] or [B, T] -> float logits [B, T, V] for
        positions + 1; mask [B, T, S + m] bool (None: slot-causal); slots [B, T] harness slots to
        write (None: each position's own; scratch slots S.. hold draft-tree nodes, which keep their
        positions' rotation)."""
        if self.keep is None or self.scratch_pos is None:
            raise RuntimeError("call setup_cache and prefill before forward")
        inputs = layout_inputs(self, tokens, positions, mask, slots, self.tokens.new_line)
        hidden = self.lm.hidden(inputs.ids, self._rope(inputs.seq), inputs.mask, inputs.write)
        self.hidden = inputs.returned(hidden)
        return self.lm.logits(self.hidden, self.code_ids)

    # ---------------------------------------------------------------- pixels
    @torch.inference_mode()
    def decode(self, tokens: Tensor) -> Tensor:
        """tokens [B, rows*cols] codes -> images [B, 3, H, W] uint8."""
        return self.tokenizer.decode(tokens.reshape(tokens.shape[0], *self.grid))

    @torch.inference_mode()
    def encode(self, images: Tensor) -> Tensor:
        """images [B, 3, H, W] uint8 -> codes [B, rows*cols]."""
        codes = self.tokenizer.encode(images)
        if tuple(codes.shape[1:]) != self.grid:
            raise ValueError(f"images of size {tuple(images.shape[2:])} give a {tuple(codes.shape[1:])} grid; "
                             f"this model needs {self.grid}")
        return codes.flatten(1)
