"""`LuminaImageModel`: a Chameleon LM laid out as Lumina-mGPT generates, exposed through the
ARImageModel contract (raster grid positions, static cache, logits over the VQGAN's codes).

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
* logits are the LM head's rows of the 8192 image codes (the official sampler suppresses every
  other id at image positions), in VQGAN code order (`code_ids`: the vocabulary id of each code);
* rotary positions count from each row's first real token (left padding shifts nothing), so a batch
  row computes what it computes alone.

Classifier-free guidance (harness/models/guidance.py doubles the batch): a null row keeps only the
header of its prefix, at rotary positions 0, 1, 2, followed by the same image tokens and <eol>s as
its conditional row. That is the official unbatched CFG: its unconditional context is
`input_ids[:, image_start_index:]` (header, then every generated token, <eol>s included) in a second
model call with its own cache, positions from 0; the mix s * (c - u) + u is element-wise, so mixing
the 8192 image logits equals mixing the 65536 and then suppressing the non-image ids.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from harness.models.lumina.chameleon import ChameleonLM
from harness.models.lumina.layout import HEADER, SpecialTokens, check_header, header
from harness.models.row_ends import SlotMap
from harness.models.lumina.prompts import ChatCondition
from harness.models.masks import attention_mask, hide
from harness.models.wrapper import forwarded


class LuminaImageModel(nn.Module):
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
        self.keep: Tensor | None = None  # [B, S + 1] bool: slots any query may see (padding hidden)
        self.offset: Tensor | None = None  # [B] rotary position of slot 0 is -offset

    @property
    def prefix_len(self) -> int:
        return self.map.prefix

    @property
    def token_embeddings(self) -> Tensor:
        """[V, dim] the LM's input embedding of each image code (vocabulary ids `code_ids`): the
        space GSD measures its groups in (its code reads Chameleon's `embed_tokens`)."""
        return self.lm.model.embed_tokens.weight[self.code_ids]

    @property
    def cache_len(self) -> int:
        return self.map.prefix + self.map.n_tokens

    @property
    def image_size(self) -> int:
        return max(self.size)

    def setup_cache(self, batch_size: int) -> None:
        self.lm.setup_cache(batch_size, self.map.slots + 1)  # + the trash slot
        self.keep = self.offset = None

    # ---------------------------------------------------------------- prefix
    @torch.inference_mode()
    def prefill(self, cond: ChatCondition) -> Tensor:
        """Write prompt + header into the prefix slots; return logits [B, V] for position 0."""
        ids, keep = cond.to(self.device).rows(self.size)
        b, p = ids.shape
        head = torch.tensor(self.header, device=self.device).expand(b, -1)
        ids = torch.cat([ids, head], 1)  # [B, prefix]
        keep = torch.cat([keep, torch.ones(b, HEADER, dtype=torch.bool, device=self.device)], 1)
        self.offset = self.map.prefix - keep.sum(1)  # padding slots before the first real token
        tail = torch.ones(b, self.map.slots + 1 - self.map.prefix, dtype=torch.bool, device=self.device)
        self.keep = torch.cat([keep, tail], 1)
        self.keep[:, self.map.trash] = False
        slots = torch.arange(self.map.prefix, device=self.device).expand(b, -1)
        mask = hide(attention_mask(slots, self.map.slots + 1), slots, ~self.keep)
        hidden = self.lm.hidden(ids, self._rope(slots), mask, slots)
        return self.lm.logits(hidden[:, -1], self.code_ids)

    def _rope(self, slots: Tensor) -> Tensor:
        """Cache slots [B, T] -> rotary positions [B, T] (each row counts from its first real token)."""
        assert self.offset is not None
        return (slots - self.offset[:, None]).clamp(min=0)

    # ---------------------------------------------------------------- image positions
    def _slot_mask(self, mask: Tensor, positions: Tensor) -> Tensor:
        """Harness mask [B, T, prefix + N] of queries at image positions [B, T] -> mask over the
        cache slots [B, T, S + 1] (see the module docstring)."""
        m = self.map
        b, t, _ = mask.shape
        out = torch.zeros(b, t, m.slots + 1, dtype=torch.bool, device=mask.device)
        out[..., :m.prefix] = mask[..., :m.prefix]
        grid = torch.arange(m.n_tokens, device=mask.device)
        out[..., m.token_slot(grid)] = mask[..., m.prefix:]
        rows = torch.arange(m.grid[0] - 1, device=mask.device)
        last = (rows + 1) * m.grid[1] - 1  # the last position of each row that has an <eol>
        out[..., m.eol_slot(rows)] = mask[..., m.prefix + last] & (positions[..., None] > last)
        return out & self.keep[:, None, :]  # type: ignore[index]

    @torch.inference_mode()
    def forward(self, tokens: Tensor, positions: Tensor, mask: Tensor | None = None) -> Tensor:  # type: ignore[override]
        """tokens [B, T] (VQGAN codes) at image positions [T] or [B, T]; mask [B, T, cache_len] bool
        or None (the prefix and every position <= the query's) -> float logits [B, T, V] for
        positions + 1."""
        if self.keep is None:
            raise RuntimeError("call setup_cache and prefill before forward")
        m, dev = self.map, self.device
        tokens = tokens.to(dev)
        b, t = tokens.shape
        positions = positions.to(dev).expand(b, -1)
        if mask is None:
            mask = attention_mask(positions + m.prefix, self.cache_len)
        elif mask.shape != (b, t, self.cache_len):
            raise ValueError(f"mask must have shape {(b, t, self.cache_len)}, got {tuple(mask.shape)}")
        slot_mask = self._slot_mask(mask.to(dev), positions)
        write = m.token_slot(positions)
        ids = self.code_ids[tokens]
        ends = m.row_ends(positions)  # [B, T]: these inputs also run their row's <eol>
        extra = int(ends.sum(1).max())
        if extra:
            # per batch row, the inputs ending a row first (stable), padded with trash inputs
            order = torch.sort((~ends).to(torch.int8), dim=1, stable=True).indices[:, :extra]  # [B, E]
            real = ends.gather(1, order)
            eol_write = torch.where(real, m.eol_slot(positions.gather(1, order) // m.grid[1]),
                                    torch.full_like(order, m.trash))
            eol_mask = slot_mask.gather(1, order[..., None].expand(-1, -1, slot_mask.shape[-1])).clone()
            eol_mask &= real[..., None]
            eol_mask.scatter_(2, eol_write[..., None], True)  # itself (a trash input sees only the trash slot)
            ids = torch.cat([ids, torch.full_like(order, self.tokens.new_line)], 1)
            write = torch.cat([write, eol_write], 1)
            slot_mask = torch.cat([slot_mask, eol_mask], 1)
        hidden = self.lm.hidden(ids, self._rope(write), slot_mask, write)
        out = hidden[:, :t]
        if extra:
            # an input ending a row returns its <eol>'s hidden state
            source = torch.arange(t, device=dev).expand(b, -1).clone()
            rows = torch.arange(b, device=dev)[:, None].expand_as(order)
            source[rows[real], order[real]] = t + torch.arange(extra, device=dev).expand(b, -1)[real]
            out = hidden.gather(1, source[..., None].expand(-1, -1, hidden.shape[-1]))
        return self.lm.logits(out, self.code_ids)

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
