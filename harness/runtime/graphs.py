"""Graph shapes of compiled forwards (`engine=compiled`, harness/runtime/engine.py).

A compiled GPT forward has one graph per input shape. The shapes a decoder asks for are (rows,
width) pairs: rows is the batch (doubled under guidance), width the tokens of one forward (1 for
raster, a tree's nodes, a verify width, a resample block, the prefix for the prefill). Widths vary
from step to step, so a compiled GPT pads every forward to `graph_width(width)`, a power of two:
a model whose widest forward has W tokens then compiles at most `width_buckets(W)` widths per
batch size (docs/methodology.md, "The decode engine", lists the bound per decoder).

`GraphBudget` keeps, per compiled model, the shapes it met and the time their first calls took
(compiling, capturing and one run: `compile_s`, reported apart from decode time). torch's own recompile limit is set per
model to the same budget (engine.apply); a model that meets more shapes logs one warning naming it
and its shapes: the forwards past the budget run uncompiled (torch falls back to eager), which
the run must know rather than time silently.
"""
from __future__ import annotations

import logging
import math

log = logging.getLogger(__name__)

GRAPH_BUDGET = 40  # shapes per compiled model: width buckets x (timed + untimed batch sizes), with room


def graph_width(width: int) -> int:
    """The width a compiled forward of `width` tokens runs at: the smallest power of two >= width
    (padded positions write a cache slot no query reads and their outputs are dropped)."""
    if width < 1:
        raise ValueError(f"a forward has at least one token, got width {width}")
    return 1 << (width - 1).bit_length()


def width_buckets(widest: int) -> int:
    """Upper bound on the distinct `graph_width`s of one model at one batch size when no forward is
    wider than `widest` tokens (the prefill's prefix included): every power of two up to it."""
    return int(math.log2(graph_width(widest))) + 1


class GraphBudget:
    """The shapes one compiled model met; warns once when they exceed `limit`."""

    def __init__(self, name: str, limit: int = GRAPH_BUDGET) -> None:
        self.name = name
        self.limit = limit
        self.shapes: set[tuple[int, ...]] = set()
        self.warned = False
        self.compile_s = 0.0  # wall time of the first call of each shape (compile, capture, one run)

    def note(self, shape: tuple[int, ...]) -> bool:
        """Record a forward of `shape`; True when it is new (compiled by this call). Logs a warning
        the first time the budget is exceeded."""
        if shape in self.shapes:
            return False
        self.shapes.add(shape)
        if len(self.shapes) > self.limit and not self.warned:
            self.warned = True
            log.warning("engine=compiled: %s met %d forward shapes, over its budget of %d graphs; torch "
                        "runs the shapes past the budget uncompiled (eager), so their decodes are not the "
                        "compiled engine's. Shapes (rows, width, cache slots): %s", self.name,
                        len(self.shapes), self.limit, sorted(self.shapes))
        return True

    @property
    def over(self) -> bool:
        """Whether this model met more shapes than its budget."""
        return len(self.shapes) > self.limit
