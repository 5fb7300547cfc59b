"""Sequences with an end-of-row token: where each image grid token and each end-of-row token lives
among a model's cache slots (Lumina-mGPT's `<eol>`, Emu3's `<|extra_200|>`), and how a model's
forward runs the end-of-row tokens the harness does not see.

The harness addresses image tokens by raster position; these models' sequences close every row
with an end-of-row token, so raster position i lives at slot `prefix + i + i // cols` and the
end-of-row token of row r right after the row's last token. Only the end-of-row tokens between
rows are inputs of an image: after the last row the image is complete.

Harness slots and cache slots. The harness sees S = `prefix + rows * cols` slots (image position i
at slot prefix + i), then m scratch slots S .. S + m - 1 for draft-tree nodes. The cache holds the
sequence (`slots`), one trash slot (padding inputs of a forward write there; no real query sees
it), the m scratch nodes, then m twins: a node at a row's last position writes its end-of-row
token to its twin, m slots further on.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from harness.models.masks import attention_mask


@dataclass(frozen=True)
class RowEndInputs:
    """A forward's T inputs with the E end-of-row inputs it also runs appended: ids, cache slots
    written and sequence slots (rotary positions + the row's padding) [B, T + E], masks
    [B, T + E, R]; `source` [B, T] the input whose hidden state each query returns (None: its own)."""

    ids: Tensor
    write: Tensor
    seq: Tensor
    mask: Tensor
    queries: int
    source: Tensor | None

    def returned(self, hidden: Tensor) -> Tensor:
        """hidden [B, T + E, D] -> [B, T, D]: an input ending a row returns its end-of-row token's
        state (it predicts the next row's first token, as in the model's sequence)."""
        if self.source is None:
            return hidden[:, :self.queries]
        return hidden.gather(1, self.source[..., None].expand(-1, -1, hidden.shape[-1]))


@dataclass(frozen=True)
class SlotMap:
    """Where each grid token and each end-of-row token lives among the cache slots.

    `prefix` slots hold the left-padded prompt and the header; then row r occupies `cols + 1`
    slots: its tokens, then its end-of-row token (the last row's is never an input: the image
    ends). The harness sees `prefix + rows * cols` slots (image position i at slot prefix + i)."""

    prefix: int
    grid: tuple[int, int]

    @property
    def n_tokens(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def harness_len(self) -> int:
        """S = prefix + rows * cols, the slots the harness addresses before its scratch slots."""
        return self.prefix + self.n_tokens

    @property
    def slots(self) -> int:
        """Cache slots of the sequence (one more, the trash slot, follows them)."""
        rows, cols = self.grid
        return self.prefix + rows * (cols + 1) - 1

    @property
    def trash(self) -> int:
        """A slot no real query sees: padding inputs of a forward write there."""
        return self.slots

    def cache_slots(self, scratch: int = 0) -> int:
        """Cache slots to allocate: the sequence, the trash slot, `scratch` nodes and their twins."""
        return self.slots + 1 + 2 * scratch

    def token_slot(self, positions: Tensor) -> Tensor:
        """Image positions [...] -> their cache slots [...]."""
        return self.prefix + positions + positions // self.grid[1]

    def eol_slot(self, rows: Tensor) -> Tensor:
        """Row indices [...] -> the cache slot of that row's end-of-row token."""
        return self.prefix + rows * (self.grid[1] + 1) + self.grid[1]

    def row_ends(self, positions: Tensor) -> Tensor:
        """Image positions [...] -> bool: the last token of a row that another row follows (the
        next input in the sequence is that row's end-of-row token)."""
        cols = self.grid[1]
        return (positions >= 0) & (positions % cols == cols - 1) & (positions < self.n_tokens - 1)

    # ---------------------------------------------------------------- harness slots
    def cache_slot(self, slots: Tensor) -> Tensor:
        """Harness slots [...] (prefix, image positions, scratch S..) -> cache slots [...]."""
        s = self.harness_len
        image = self.token_slot((slots - self.prefix).clamp(min=0))
        node = self.slots + 1 + (slots - s)  # scratch node k at the cache slot after the trash slot + k
        return torch.where(slots < self.prefix, slots, torch.where(slots < s, image, node))

    def note_nodes(self, node_pos: Tensor, slots: Tensor, positions: Tensor) -> None:
        """Record in node_pos [B, m] the image positions [B, T] of the inputs written to scratch
        harness slots [B, T] (the slot masks of later forwards show a node's twin by it)."""
        node = slots >= self.harness_len
        if node_pos.shape[1] and bool(node.any()):
            rows = torch.arange(slots.shape[0], device=slots.device)[:, None].expand_as(slots)
            node_pos[rows[node], (slots - self.harness_len)[node]] = positions[node]

    def slot_mask(self, mask: Tensor, positions: Tensor, node_pos: Tensor) -> Tensor:
        """Harness mask [B, T, S + m] of queries at image positions [B, T], scratch nodes at image
        positions node_pos [B, m] (-1: none) -> mask over the cache slots [B, T, cache_slots(m)].

        The end-of-row token of row r (in the sequence, or a node's twin) is seen by a query iff the
        query sees row r's last token (that slot, or the node) and comes after it (query position >
        that token's)."""
        b, t, _ = mask.shape
        m, s = node_pos.shape[1], self.harness_len
        out = torch.zeros(b, t, self.cache_slots(m), dtype=torch.bool, device=mask.device)
        out[..., :self.prefix] = mask[..., :self.prefix]
        grid = torch.arange(self.n_tokens, device=mask.device)
        out[..., self.token_slot(grid)] = mask[..., self.prefix:s]
        rows = torch.arange(self.grid[0] - 1, device=mask.device)
        last = (rows + 1) * self.grid[1] - 1  # the last position of each row that has an end-of-row token
        out[..., self.eol_slot(rows)] = mask[..., self.prefix + last] & (positions[..., None] > last)
        if m:
            node = self.slots + 1
            seen = mask[..., s:]  # [B, T, m]
            out[..., node:node + m] = seen
            pos = node_pos[:, None, :]
            out[..., node + m:] = seen & self.row_ends(pos) & (positions[..., None] > pos)  # twins
        return out

    def moves(self, src: Tensor, dst: Tensor, scratch: int) -> tuple[Tensor, Tensor]:
        """Harness slots src, dst [B, A] of `move_cache` (m = `scratch` nodes) -> cache slots
        (from, to) [B, 2A]: each slot, then, where dst is a row's last position, the end-of-row
        token that goes with it (a node's twin, or the source row's); trash to trash elsewhere."""
        pos = dst - self.prefix  # image positions of the destinations
        ends = (dst >= self.prefix) & (dst < self.harness_len) & self.row_ends(pos)
        src_eol = torch.where(src >= self.harness_len, self.cache_slot(src) + scratch,
                              self.eol_slot((src - self.prefix).clamp(min=0) // self.grid[1]))
        trash = torch.full_like(src, self.trash)
        dst_eol = self.eol_slot(pos.clamp(min=0) // self.grid[1])
        return (torch.cat([self.cache_slot(src), torch.where(ends, src_eol, trash)], 1),
                torch.cat([self.cache_slot(dst), torch.where(ends, dst_eol, trash)], 1))

    def with_row_ends(self, ids: Tensor, write: Tensor, positions: Tensor, mask: Tensor, eol_id: int,
                      scratch: int) -> RowEndInputs:
        """Inputs ids [B, T] written to cache slots write [B, T] at image positions [B, T] with cache
        masks [B, T, R] -> the same inputs plus, for each input at a row's last position, that row's
        end-of-row token `eol_id` after it: written to the row's end-of-row slot (a scratch node's
        to its twin, `scratch` slots on), seeing what its row's last token sees plus itself. Batch
        rows with fewer such inputs are padded with inputs that write to the trash slot and see
        only it."""
        b, t = ids.shape
        seq = self.token_slot(positions)
        ends = self.row_ends(positions)  # [B, T]: these inputs also run their row's end-of-row token
        extra = int(ends.sum(1).max())
        if not extra:
            return RowEndInputs(ids, write, seq, mask, t, None)
        # per batch row, the inputs ending a row first (stable), padded with trash inputs
        order = torch.sort((~ends).to(torch.int8), dim=1, stable=True).indices[:, :extra]  # [B, E]
        real = ends.gather(1, order)
        own = write.gather(1, order)
        row_eol = self.eol_slot(positions.gather(1, order) // self.grid[1])
        eol_at = torch.where(own > self.slots, own + scratch, row_eol)  # a scratch node's: its twin
        eol_write = torch.where(real, eol_at, torch.full_like(order, self.trash))
        eol_mask = mask.gather(1, order[..., None].expand(-1, -1, mask.shape[-1])).clone()
        eol_mask &= real[..., None]
        eol_mask.scatter_(2, eol_write[..., None], True)  # itself (a trash input sees only the trash slot)
        source = torch.arange(t, device=ids.device).expand(b, -1).clone()
        rows = torch.arange(b, device=ids.device)[:, None].expand_as(order)
        source[rows[real], order[real]] = t + torch.arange(extra, device=ids.device).expand(b, -1)[real]
        return RowEndInputs(ids=torch.cat([ids, torch.full_like(order, eol_id)], 1),
                            write=torch.cat([write, eol_write], 1),
                            seq=torch.cat([seq, seq.gather(1, order) + 1], 1),
                            mask=torch.cat([mask, eol_mask], 1), queries=t, source=source)


def layout_inputs(model: Any, tokens: Tensor, positions: Tensor, mask: Tensor | None, slots: Tensor | None,
                  eol_id: int) -> Any:
    """A cached forward's harness-side arguments -> the LM's inputs with the end-of-row tokens
    (`SlotMap.with_row_ends`), for an image model over a SlotMap (Lumina-mGPT, Emu3): tokens [B, T]
    codes at image positions [T] or [B, T], mask [B, T, S + m] bool (None: slot-causal), slots
    [B, T] harness slots to write (None: each position's own). `model` holds `map`, `device`,
    `total` (slots + scratch), `cache_len`, `scratch`, `scratch_pos`, `code_ids` and `_slot_mask`."""
    m, dev = model.map, model.device
    tokens = tokens.to(dev)
    b, t = tokens.shape
    positions = positions.to(dev).expand(b, -1)
    write = positions + m.prefix if slots is None else slots.to(dev).expand(b, -1)
    if mask is None:
        mask = attention_mask(write, model.total)
    elif mask.shape != (b, t, model.total):
        raise ValueError(f"mask must have shape {(b, t, model.total)} (S = {model.cache_len} slots + "
                         f"{model.scratch} scratch), got {tuple(mask.shape)}")
    m.note_nodes(model.scratch_pos, write, positions)
    slot_mask = model._slot_mask(mask.to(dev), positions)
    return m.with_row_ends(model.code_ids[tokens], m.cache_slot(write), positions, slot_mask, eol_id, model.scratch)

