"""Rejection islands and MuLo-SD's resampler without host reads or [B, L, L] tensors
(baselines/methods/islands.py, baselines/methods/resampling.py): every piece gives what the pairwise, read-per-step,
pack-per-forward implementation gave (kept below as the reference), and one `fill` reads the device
at most once (plus one read per chunk of labelling passes) when reads are not free."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from baselines.methods import islands, resampling
from baselines.methods.islands import block_islands, dense, island_steps, label_islands, serial_steps
from baselines.methods.local import LocalScope, block_coordinates
from baselines.methods.lowres import LowResDraft
from baselines.framework.canvas import feed_positions
from baselines.methods.pooled import PooledThresholdRule, anchor_table, anchored
from baselines.methods.resampling import IslandResampler
from baselines.framework.scope import Resolution
from baselines.framework.speculative import SpeculativeDecoder
from baselines.methods.upsamplers import NearestUpsampler
from harness.runtime import engine, hostsync
from harness.api import ModelBundle, SamplingParams
from harness.models.masks import attention_mask
from harness.models.random.bundle import build
from harness.run import guided
from harness.runtime.sampling import inverse_cdf, probs
from tests.single_thread import single_thread  # noqa: F401  (autouse)

SAMPLED = SamplingParams(temperature=1.0, top_k=20, top_p=0.9, cfg_scale=2.0)
PROMPTS = ["a red circle", "two blue squares", "a green triangle left of a star"]


# ----------------------------------------------------------------------------- the reference
# The implementation before this rewrite, verbatim but for names: pairwise [B, L, L] comparisons
# and one host read per labelling pass, per schedule and per packed forward.
def _reference_label_islands(marked: Tensor) -> Tensor:
    _, rows, cols = marked.shape
    big = float(rows * cols)
    index = torch.arange(rows * cols, device=marked.device, dtype=torch.float32).view(1, 1, rows, cols)
    labels = torch.where(marked[:, None], index, big)
    while True:
        spread = -F.max_pool2d(-labels, 3, stride=1, padding=1)  # 3 x 3 minimum
        spread = torch.where(marked[:, None], spread, big)
        if torch.equal(spread, labels):
            break
        labels = spread
    return torch.where(marked, labels[:, 0].long(), -1)


def _reference_block_islands(members: Tensor, start: Tensor, grid: tuple[int, int]) -> Tensor:
    rows, cols = grid
    b, length = members.shape
    index = (start[:, None] + torch.arange(length, device=members.device)).clamp(max=rows * cols)
    board = torch.zeros(b, rows * cols + 1, dtype=torch.bool, device=members.device)
    board.scatter_(1, index, members)
    labels = _reference_label_islands(board[:, :-1].view(b, rows, cols)).view(b, -1)
    labels = torch.cat([labels, torch.full((b, 1), -1, device=members.device, dtype=torch.long)], 1)
    return torch.where(members, labels.gather(1, index), -1)


def _reference_dense(steps: Tensor) -> Tensor:
    top = int(steps.max()) + 1 if steps.numel() else 0
    if top <= 0:
        return steps
    used = torch.zeros(steps.shape[0], top + 1, dtype=torch.long, device=steps.device)
    used.scatter_(1, (steps + 1).clamp_min(0), 1)  # column 0 collects the -1 entries
    used[:, 0] = 0
    rank = used.cumsum(1) - 1  # rank of step s is rank[s + 1]
    return torch.where(steps >= 0, rank.gather(1, steps + 1), -1)


def _reference_island_steps(resample: Tensor, first: Tensor, start: Tensor, grid: tuple[int, int],
                            window: int) -> tuple[Tensor, Tensor]:
    length = resample.shape[1]
    offsets = torch.arange(length, device=resample.device)
    members = resample | (offsets[None] == first[:, None])
    labels = _reference_block_islands(members, start, grid)
    row, col = block_coordinates(start, length, grid[1])
    same_island = (labels[:, :, None] == labels[:, None, :]) & members[:, None, :]  # [B, L, L]
    big = torch.iinfo(torch.long).max
    top = torch.where(same_island, row[:, None, :], big).min(-1).values  # island's first row
    same_row = same_island & (row[:, :, None] == row[:, None, :]) & resample[:, None, :]
    k = (same_row & (col[:, None, :] < col[:, :, None])).sum(-1)  # rank within the island row
    steps = torch.where(resample, (row - top) * window + k, -1)
    return _reference_dense(steps), labels


def _reference_statistics(labels: Tensor) -> dict[str, Tensor]:
    """_count's island statistics [B], pairwise."""
    members = labels >= 0
    offsets = torch.arange(labels.shape[1], device=labels.device)
    same = (labels[:, :, None] == labels[:, None, :]) & members[:, :, None] & members[:, None, :]
    roots = members & ~(same & (offsets[None, None, :] < offsets[None, :, None])).any(-1)
    return {"resample_set": members.sum(-1), "islands": roots.sum(-1),
            "island_size_max": same.sum(-1).max(-1).values}


def _reference_pack(selected: Tensor) -> tuple[Tensor, Tensor]:
    length = selected.shape[1]
    offsets = torch.arange(length, device=selected.device)
    width = max(int(selected.sum(-1).max()), 1)
    key = torch.where(selected, offsets, offsets + length)  # selected first, each group in order
    order = key.argsort(-1)[:, :width]
    return order, selected.gather(1, order)


class _ReferenceResampler(IslandResampler):
    """The resampler's fill as it was: the reference schedules and statistics, reads per forward,
    and each forward packing its own inputs and drawn positions (exact widths) instead of reading
    them from the fill's tables."""

    def fill(self, ctx, canvas, res):  # type: ignore[no-untyped-def]
        start, length = canvas.frontier, res.resample.shape[1]
        offsets = torch.arange(length, device=start.device)
        if self.schedule == "serial":
            steps = serial_steps(res.resample)
            members = res.resample | (offsets[None] == res.first[:, None])
            labels = _reference_block_islands(members, start, ctx.grid)
        else:
            steps, labels = _reference_island_steps(res.resample, res.first, start, ctx.grid, self.window)
        u = ctx.streams.draw((length,))  # L draws per image, used or not
        forwards = steps.max(-1).values + 1  # [B]
        ready = self._kept_ready(steps, res) if self.kv == "inline" else None
        for s in range(int(forwards.max())):
            self._reference_forward(ctx, canvas, steps, res.first, s, u, ready)
        ctx.count("verify_forwards", (res.advance > 0).long())
        ctx.count("resample_forwards", forwards)
        for name, values in _reference_statistics(labels).items():
            ctx.count(name, values, reduce="max" if name == "island_size_max" else "sum")
        return replace(res, kv_valid=self._kv_valid(res, steps, forwards, ready)), forwards

    def _reference_forward(self, ctx, canvas, steps, first, s, u, ready=None):  # type: ignore[no-untyped-def]
        start, (b, length) = canvas.frontier, steps.shape
        offsets = torch.arange(length, device=start.device)
        fresh = (steps == s - 1) if s else (offsets[None] == first[:, None])
        if ready is not None:
            fresh = fresh | (ready == s)
        drawn = steps == s
        queries = torch.cat([drawn[:, 1:], torch.zeros_like(drawn[:, :1])], 1)  # offset o predicts o + 1
        feed, feed_ok = _reference_pack(fresh | queries)
        index = start[:, None] + feed
        tokens = canvas.tokens.gather(1, index)
        positions = torch.where(feed_ok, feed_positions(index, ctx.n_tokens), ctx.n_tokens - 1)
        mask = _reference_mask(ctx, start, positions, steps >= s) if self.context == "masked" else None
        logits = ctx.models.target.forward(tokens, positions, mask)  # [B, W, V]
        slot_of = torch.zeros(b, length + 1, dtype=torch.long, device=start.device)  # offset -> input
        inputs = torch.arange(feed.shape[1], device=start.device).expand(b, -1)
        slot_of.scatter_(1, torch.where(feed_ok, feed, length), inputs)
        out, out_ok = _reference_pack(drawn)
        source = slot_of.gather(1, (out - 1).clamp_min(0))
        picked = logits.gather(1, source[..., None].expand(-1, -1, logits.shape[-1]))
        where = start[:, None] + out
        there = canvas.tokens.gather(1, where)
        p = probs(picked, ctx.sampling)
        if self.anchor:
            p = anchored(p, there, anchor_table(ctx, self.anchor))
        new = inverse_cdf(p, u.gather(1, out))
        canvas.tokens.scatter_(1, where, torch.where(out_ok, new, there))


def _reference_mask(ctx, start: Tensor, positions: Tensor, pending: Tensor) -> Tensor:  # type: ignore[no-untyped-def]
    """Slot-causal mask [B, W, S] without the slots of pending offsets [B, L] (but a query's own)."""
    slots = ctx.models.target.cache_len
    prefix = slots - ctx.n_tokens
    hidden = torch.zeros(start.shape[0], slots + 1, dtype=torch.bool, device=start.device)
    offsets = torch.arange(pending.shape[1], device=start.device)
    hidden.scatter_(1, (start[:, None] + prefix + offsets).clamp(max=slots), pending)
    return attention_mask(positions + prefix, slots, hidden[:, :slots])


# ----------------------------------------------------------------------------- random inputs
def _random_masks(g: torch.Generator, count: int) -> Iterator[Tensor]:
    """marked [B, R, C] bool on random grids (single rows and columns too) at random densities."""
    for _ in range(count):
        rows, cols = (int(x) for x in torch.randint(1, 13, (2,), generator=g))
        batch = int(torch.randint(1, 5, (1,), generator=g))
        density = torch.rand(batch, 1, 1, generator=g)
        yield torch.rand(batch, rows, cols, generator=g) < density


Block = tuple[Tensor, Tensor, Tensor, tuple[int, int]]


def _random_blocks(g: torch.Generator, count: int) -> Iterator[Block]:
    """(resample [B, L], first [B], start [B], grid) as LocalScope gives them: R_X after t0 and
    on the image (t0 = L: nothing rejected), blocks at random starts, some past the image's end."""
    for _ in range(count):
        rows, cols = (int(x) for x in torch.randint(1, 13, (2,), generator=g))
        n, batch = rows * cols, int(torch.randint(1, 5, (1,), generator=g))
        length = int(torch.randint(1, n + 1, (1,), generator=g))
        start = torch.randint(0, n, (batch,), generator=g)
        offsets = torch.arange(length)
        valid = offsets[None] < (n - start)[:, None]
        first = torch.where(torch.rand(batch, generator=g) < 0.1, length,
                            torch.randint(0, length, (batch,), generator=g))
        first = torch.where(first < (n - start), first, length)
        density = torch.rand(batch, 1, generator=g)
        resample = torch.rand(batch, length, generator=g) < density
        resample &= valid & (offsets[None] > first[:, None])
        yield resample, first, start, (rows, cols)


@pytest.fixture(params=["cpu path", "accelerator path"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test both ways: reads free (the CPU) and not (hostsync answers False)."""
    if request.param == "accelerator path":
        monkeypatch.setattr(hostsync, "reads_are_free", lambda device: False)
    return request.param


def test_labels_match_the_reference(path: str) -> None:
    g = torch.Generator().manual_seed(1)
    for marked in _random_masks(g, 300):
        assert torch.equal(label_islands(marked), _reference_label_islands(marked)), marked.shape


def _serpentine(rows: int, cols: int) -> Tensor:
    """[R, C] bool: full even rows joined alternately at the right and the left end (one path)."""
    marked = torch.zeros(rows, cols, dtype=torch.bool)
    marked[::2] = True
    for r in range(1, rows, 2):
        marked[r, cols - 1 if r % 4 == 1 else 0] = True
    return marked


def _spiral(size: int) -> Tensor:
    """[S, S] bool: a path winding inwards, one cell wide, laps two cells apart."""
    marked = torch.zeros(size, size, dtype=torch.bool)
    r, c, dr, dc = 0, 0, 0, 1
    marked[0, 0] = True
    while True:
        moved = False
        for _ in range(2):  # go straight while the cell two ahead is free and on the grid
            nr, nc = r + 2 * dr, c + 2 * dc
            if 0 <= nr < size and 0 <= nc < size and not marked[nr, nc] and not marked[r + dr, c + dc]:
                marked[r + dr, c + dc] = marked[nr, nc] = True
                r, c, moved = nr, nc, True
                break
            dr, dc = dc, -dr  # turn right
        if not moved:
            return marked


@pytest.mark.parametrize("shape", ["rows", "columns", "spiral"])
def test_labels_of_one_long_winding_island(shape: str, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worst case for label propagation: a path of ~N / 2 cells that the 3 x 3 minimum alone
    crosses in one pass per cell. Every cell gets label 0, in a few passes."""
    marked = {"rows": _serpentine(48, 40), "columns": _serpentine(40, 48).T, "spiral": _spiral(41)}[shape]
    marked = torch.stack([marked, marked.flip(1)])  # the second image's path starts at the right
    checks = []
    equal = torch.equal
    monkeypatch.setattr(torch, "equal", lambda a, b: checks.append(1) or equal(a, b))
    labels = label_islands(marked)
    monkeypatch.setattr(torch, "equal", equal)
    assert (labels[0][marked[0]] == 0).all() and (labels[0][~marked[0]] == -1).all()
    assert (labels[1][marked[1]] == int(marked[1].flatten().nonzero()[0])).all()
    assert torch.equal(labels, _reference_label_islands(marked))
    assert len(checks) <= (24 if path == "cpu path" else 6), "one pass per cell of the path"


def test_dense_matches_the_reference() -> None:
    g = torch.Generator().manual_seed(2)
    for _ in range(300):
        batch = int(torch.randint(1, 5, (1,), generator=g))
        length = int(torch.randint(1, 40, (1,), generator=g))
        bound = int(torch.randint(1, 2 * length + 1, (1,), generator=g))
        steps = torch.randint(-1, bound, (batch, length), generator=g)
        steps[torch.rand(batch, length, generator=g) < 0.3] = -1
        assert torch.equal(dense(steps, bound), _reference_dense(steps))
        small = steps.clamp(max=length - 1)  # the default bound: L
        assert torch.equal(dense(small), _reference_dense(small))
    none = torch.full((2, 5), -1)
    assert torch.equal(dense(none), none)


def test_island_steps_match_the_reference(path: str) -> None:
    g = torch.Generator().manual_seed(3)
    for resample, first, start, grid in _random_blocks(g, 200):
        for window in (1, 2, 3, grid[1] - 1, grid[1], grid[1] + 1, 100):
            window = max(window, 1)
            steps, labels = island_steps(resample, first, start, grid, window)
            ref_steps, ref_labels = _reference_island_steps(resample, first, start, grid, window)
            assert torch.equal(labels, ref_labels), (grid, window)
            assert torch.equal(steps, ref_steps), (grid, window)


class _Counts:
    """A Context stand-in for _count: keeps what it is told."""

    def __init__(self) -> None:
        self.counts: dict[str, Tensor] = {}

    def count(self, name: str, values: Tensor, reduce: str = "sum") -> None:
        self.counts[name] = values


def test_statistics_match_the_reference() -> None:
    g = torch.Generator().manual_seed(4)
    for resample, first, start, grid in _random_blocks(g, 300):
        length = resample.shape[1]
        members = resample | (torch.arange(length)[None] == first[:, None])
        labels = block_islands(members, start, grid)
        res = Resolution(keep=~members, rejected=members, first=first, resample=resample,
                         advance=torch.full_like(first, length), kv_valid=first)
        ctx = _Counts()
        IslandResampler._count(ctx, res, labels, torch.zeros_like(first), start)  # type: ignore[arg-type]
        for name, values in _reference_statistics(labels).items():
            assert torch.equal(ctx.counts[name], values), name


def test_widths_are_the_packed_counts() -> None:
    """_widths gives, for every step, the widths the reference forward packs."""
    g = torch.Generator().manual_seed(5)
    for resample, first, start, grid in _random_blocks(g, 150):
        length = resample.shape[1]
        steps, _ = island_steps(resample, first, start, grid, int(torch.randint(1, 4, (1,), generator=g)))
        kept = ~resample & (torch.arange(length)[None] > first[:, None])
        kept &= torch.rand(resample.shape, generator=g) < 0.7
        res = Resolution(keep=kept, rejected=resample, first=first, resample=resample,
                         advance=torch.full_like(first, length), kv_valid=first)
        for ready in (None, IslandResampler._kept_ready(steps, res)):
            widths = IslandResampler._widths(steps, IslandResampler._inputs(steps, first, ready))
            offsets = torch.arange(length)
            for s in range(length):
                fresh = (steps == s - 1) if s else (offsets[None] == first[:, None])
                if ready is not None:
                    fresh = fresh | (ready == s)
                drawn = steps == s
                queries = torch.cat([drawn[:, 1:], torch.zeros_like(drawn[:, :1])], 1)
                assert int(widths[0, s]) == _reference_pack(fresh | queries)[0].shape[1], s
                assert int(widths[1, s]) == _reference_pack(drawn)[0].shape[1], s


def test_buckets_are_powers_of_two() -> None:
    widths = (0, 1, 2, 3, 4, 5, 17, 33, 48)
    assert [resampling.bucket(w, 48) for w in widths] == [1, 1, 2, 4, 4, 8, 32, 48, 48]
    want = [resampling.bucket(w, 48) for w in range(49)]
    assert resampling.buckets(48, torch.device("cpu")).tolist() == want


# ----------------------------------------------------------------------------- decoding
@pytest.fixture(scope="module")
def bundle() -> ModelBundle:
    return build(grid=8, vocab=32, dim=32)  # target 8 x 8, drafter 4 x 4 (r = 2)


def _decoder(resampler: IslandResampler, rows: int | None = None, tau: float = 0.05,
             radius: int = 1) -> SpeculativeDecoder:
    draft = LowResDraft(NearestUpsampler(), rows=rows, schedule="zipar", window=2)
    rule = PooledThresholdRule(k=4, tau=tau)
    return SpeculativeDecoder(SAMPLED, draft, rule, LocalScope(radius), resampler)


def _decode(bundle: ModelBundle, decoder: SpeculativeDecoder) -> tuple[Tensor, list[dict[str, Any]]]:
    models = guided(bundle, SAMPLED)
    out = decoder.generate(models, models.condition(PROMPTS), [1, 2, 3])
    return out.tokens, [s.as_row() for s in out.stats]


VARIANTS: list[dict[str, Any]] = [
    {"schedule": "parallel", "window": 2, "context": "masked", "kv": "refresh"},
    {"schedule": "parallel", "window": 1, "context": "visible", "kv": "inline"},
    {"schedule": "parallel", "window": 3, "context": "masked", "kv": "stale", "anchor": 1},
    {"schedule": "serial", "context": "masked", "kv": "inline"},
    {"schedule": "serial", "context": "visible", "kv": "stale"},
]


@pytest.mark.parametrize("variant", range(len(VARIANTS)))
def test_decodes_match_the_reference_resampler(bundle: ModelBundle, variant: int,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole MuLo-SD decodes: the same tokens and statistics as the reference resampler, with
    exact widths and with widths rounded up to powers of two."""
    options = VARIANTS[variant]
    rows = None if variant % 2 == 0 else 1
    tokens, stats = _decode(bundle, _decoder(_ReferenceResampler(**options), rows=rows))
    assert any(s["islands"] > 1 for s in stats), "the test needs blocks with several islands"
    for rounded in (False, True):
        monkeypatch.setattr(resampling, "BUCKET", rounded)
        got_tokens, got_stats = _decode(bundle, _decoder(IslandResampler(**options), rows=rows))
        assert torch.equal(got_tokens, tokens), rounded
        assert got_stats == stats, rounded


def test_bucketed_and_exact_widths_give_identical_tokens(bundle: ModelBundle,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Padding a forward to a power of two changes its shape, not a token; the default rounds
    only where reads are not free (or a model is compiled per shape)."""
    models = guided(bundle, SAMPLED)
    target, cond = models.target, models.condition(PROMPTS)
    forward = target.forward
    runs: dict[str, tuple[Tensor, list[dict[str, Any]], list[int]]] = {}
    for name, rounded, free in (("exact", False, True), ("bucketed", True, True), ("default cpu", None, True),
                                ("default accelerator", None, False)):
        widths: list[int] = []

        def spy(tokens, positions, mask=None, _widths=widths, **out):  # type: ignore[no-untyped-def]
            _widths.append(tokens.shape[1])
            return forward(tokens, positions, mask, **out)

        monkeypatch.setattr(resampling, "BUCKET", rounded)
        monkeypatch.setattr(hostsync, "reads_are_free", lambda device, _free=free: _free)
        monkeypatch.setattr(engine, "compiled_anywhere", lambda: False)  # no compiled model here
        target.forward = spy  # type: ignore[method-assign]
        try:
            out = _decoder(IslandResampler("parallel", window=2)).generate(models, cond, [1, 2, 3])
        finally:
            del target.forward
        runs[name] = (out.tokens, [s.as_row() for s in out.stats], widths)
    exact = runs["exact"]
    for name, (tokens, stats, widths) in runs.items():
        assert torch.equal(tokens, exact[0]), name
        assert stats == exact[1], name
    assert runs["default cpu"][2] == exact[2]
    accelerator, bucketed = runs["default accelerator"][2], runs["bucketed"][2]
    # off the CPU the loop's "any row left" check is read one step late: one more verification
    assert accelerator[:len(bucketed)] == bucketed and len(accelerator) - len(bucketed) <= 1
    assert bucketed != exact[2]
    assert all(w & (w - 1) == 0 or w == 64 for w in runs["bucketed"][2][1:]), "powers of two (or L)"


# ----------------------------------------------------------------------------- host reads
class _Reads:
    """Counts host reads of tensor values (bool/int/float/index/item/tolist/torch.equal) while on."""

    READERS = ("__bool__", "__int__", "__float__", "__index__", "item", "tolist")

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.on, self.reads, self.equals = False, 0, 0
        for name in self.READERS:
            monkeypatch.setattr(torch.Tensor, name, self._counted(getattr(torch.Tensor, name)))
        equal = torch.equal

        def counted_equal(a: Tensor, b: Tensor) -> bool:
            self.equals += self.on
            return equal(a, b)

        monkeypatch.setattr(torch, "equal", counted_equal)

    def _counted(self, original: Any) -> Any:
        def read(*args: Any, **kwargs: Any) -> Any:
            self.reads += self.on
            return original(*args, **kwargs)
        return read


@pytest.mark.parametrize("schedule", ["parallel", "serial"])
def test_a_fill_reads_the_device_once_plus_once_per_labelling_chunk(
        bundle: ModelBundle, schedule: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the accelerator path (hostsync says reads are not free) a fill reads the device once: its
    plan with the labelling's settled flag (LABEL_PASSES fixed passes); the model is not counted."""
    models = guided(bundle, SAMPLED)
    monkeypatch.setattr(hostsync, "reads_are_free", lambda device: False)
    reads = _Reads(monkeypatch)
    passes = []
    label_pass = islands._label_pass
    monkeypatch.setattr(islands, "_label_pass", lambda *a: passes.append(reads.on) or label_pass(*a))
    fills, fill = [], IslandResampler.fill
    forward, cond = models.target.forward, models.condition(PROMPTS)

    def counted_fill(self, ctx, canvas, res):  # type: ignore[no-untyped-def]
        reads.on, reads.reads, reads.equals, passes[:] = True, 0, 0, []
        try:
            return fill(self, ctx, canvas, res)
        finally:
            reads.on = False
            fills.append((reads.reads, reads.equals, len(passes)))

    def uncounted(tokens, positions, mask=None, **out):  # type: ignore[no-untyped-def]
        on, reads.on = reads.on, False
        try:
            return forward(tokens, positions, mask, **out)
        finally:
            reads.on = on

    monkeypatch.setattr(IslandResampler, "fill", counted_fill)
    models.target.forward = uncounted  # type: ignore[method-assign]
    try:
        out = _decoder(IslandResampler(schedule, window=2), rows=1).generate(models, cond, [1, 2, 3])
    finally:
        del models.target.forward
    assert fills and any(s.extra["resample_forwards"] > 1 for s in out.stats), "the test needs resampling"
    for other, equals, passes_run in fills:
        # the labelling's fixed passes settled: their flag came with the plan, the fill's one read
        assert (other, equals, passes_run) == (1, 0, resampling.LABEL_PASSES)


def test_an_unsettled_labelling_is_finished_and_gives_the_same_tokens(
        bundle: ModelBundle, monkeypatch: pytest.MonkeyPatch) -> None:
    """With too few fixed passes the plan's flag says so; the fill labels again with checks and
    decodes exactly what the CPU path decodes."""
    models = guided(bundle, SAMPLED)
    cond = models.condition(PROMPTS)
    want = _decoder(IslandResampler("parallel", window=2)).generate(models, cond, [1, 2, 3]).tokens
    monkeypatch.setattr(hostsync, "reads_are_free", lambda device: False)
    monkeypatch.setattr(resampling, "LABEL_PASSES", 1)
    schedules = []
    schedule = IslandResampler._schedule
    monkeypatch.setattr(IslandResampler, "_schedule",
                        lambda self, *a: schedules.append(a[3]) or schedule(self, *a))  # a[3]: passes
    got = _decoder(IslandResampler("parallel", window=2)).generate(models, cond, [1, 2, 3]).tokens
    assert None in schedules, "some labelling did not settle in one pass and was finished with checks"
    assert torch.equal(got, want)
