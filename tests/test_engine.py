"""The decode engine (harness/runtime/engine.py): compiled forwards decode what eager ones do, caches are
allocated once and reused, and an engine that cannot run here stops before generation."""
from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from baselines.methods.raster import RasterDecoder
from harness.runtime import engine, hostsync
from harness.api import ConfigValueError, SamplingParams
from harness.models.random.bundle import build
from harness.run import _build, guided
from tests.conftest import ROOT, compose_cfg

DECODERS = sorted(p.stem for p in (ROOT / "conf" / "decoder").glob("*.yaml"))
PROMPTS = ["a red circle", "two blue squares", "a green triangle above a red circle"]


def _decode(name: str, bundle, seeds: list[int]) -> torch.Tensor:
    cfg = compose_cfg([f"decoder=[{name}]", "model=random", "sampling.temperature=0"])
    decoder = _build(cfg.decoder[name])
    models = guided(bundle, decoder.sampling)
    return decoder.generate(models, models.condition(PROMPTS), seeds).tokens


# One decoder of each kind of forward a compiled model meets (a token, a window, a draft tree in
# scratch slots, an EAGLE head's tree, grid-row windows, whole-image verification and islands); the
# other decoders reuse those paths and run under -m slow.
COMPILED_DEFAULT = ("raster", "sjd", "sjd_pac", "eagle2", "zipar", "mulo_sd")


def _compiled_equals_eager(names: list[str]) -> None:
    eager = build(grid=8, vocab=64, dim=64)
    compiled = copy.deepcopy(eager)
    assert engine.apply(compiled, "compiled", torch.device("cpu")) == 3  # target, drafter, small drafter
    for name in names:
        want = _decode(name, eager, [1, 2, 3])
        got = _decode(name, compiled, [1, 2, 3])
        assert torch.equal(got, want), name
    assert engine.compiled_shapes() > 0


@pytest.mark.skipif(engine.unavailable(torch.device("cpu")) is not None, reason="no C++ compiler for inductor")
def test_compiled_and_eager_decode_the_same_greedy_tokens_for_each_kind_of_forward() -> None:
    assert set(COMPILED_DEFAULT) <= set(DECODERS)
    _compiled_equals_eager(list(COMPILED_DEFAULT))


@pytest.mark.slow
@pytest.mark.skipif(engine.unavailable(torch.device("cpu")) is not None, reason="no C++ compiler for inductor")
def test_compiled_and_eager_decode_the_same_greedy_tokens_for_every_other_decoder() -> None:
    _compiled_equals_eager([name for name in DECODERS if name not in COMPILED_DEFAULT])


@pytest.mark.skipif(engine.unavailable(torch.device("cpu")) is not None, reason="no C++ compiler for inductor")
def test_compiled_models_pad_widths_and_have_graph_budgets_of_their_own(monkeypatch: pytest.MonkeyPatch,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    """Each compiled GPT runs a code object of its own (torch's recompile limit is per model), pads
    forwards to power-of-two widths with the same logits and cache entries as eager, and names
    itself in one warning when it meets more shapes than its budget."""
    eager = build(grid=4, vocab=32, dim=32)
    bundle = copy.deepcopy(eager)
    monkeypatch.setattr(engine, "RECOMPILE_LIMIT", 2)
    assert engine.apply(bundle, "compiled", torch.device("cpu")) == 3
    gpts = [gpt for _, gpt in engine._gpts(bundle)]
    codes = {gpt._stack._torchdynamo_orig_callable.__code__ for gpt in gpts}  # type: ignore[union-attr]
    assert len(codes) == 3 and all(gpt.budget.limit == 2 for gpt in gpts)
    target, reference = bundle.target.gpt, eager.target.gpt
    target.setup_cache(1)
    reference.setup_cache(1)
    tokens = torch.arange(7)[None] % 32
    with caplog.at_level("WARNING", logger="harness.runtime.graphs"), torch.inference_mode():
        for start, width in ((0, 1), (1, 3), (4, 3), (7, 5)):  # widths 1, 4, 4, 8 compiled: 3 shapes
            positions = torch.arange(start, start + width)
            want = reference.forward_cached(tokens[:, :width] + start, positions)
            got = target.forward_cached(tokens[:, :width] + start, positions)
            assert got.shape == want.shape and torch.allclose(got, want, atol=1e-4), (start, width)
            assert torch.allclose(target.last_hidden, reference.last_hidden, atol=1e-4)
    real = reference.cache_slots
    for ours, theirs in zip(target.layers, reference.layers):
        assert torch.allclose(ours.attention.kv_cache.k_cache[:, :, :real], theirs.attention.kv_cache.k_cache,
                              atol=1e-5)
    assert target.budget.shapes == {(1, 1, real + 1), (1, 4, real + 1), (1, 8, real + 1)}
    warnings = [r.getMessage() for r in caplog.records if "over its budget" in r.getMessage()]
    assert len(warnings) == 1 and target.budget.name in warnings[0]
    assert target.budget.name in engine.over_budget() and engine.compile_seconds() > 0


def test_caches_are_allocated_once_and_reuse_equals_fresh() -> None:
    params = SamplingParams(temperature=1.0, top_k=20, cfg_scale=2.0)
    bundle = build(grid=4, vocab=32, dim=32)
    models = guided(bundle, params)
    cond = models.condition(PROMPTS)
    first = RasterDecoder(params).generate(models, cond, [5, 6, 7]).tokens
    cache = bundle.target.gpt.layers[0].attention.kv_cache
    assert not cache.k_cache.is_inference()  # compiled code may update it
    other = RasterDecoder(params).generate(models, models.condition(PROMPTS[::-1]), [8, 9, 10]).tokens
    again = RasterDecoder(params).generate(models, cond, [5, 6, 7]).tokens
    assert bundle.target.gpt.layers[0].attention.kv_cache is cache  # reused, not reallocated
    fresh = RasterDecoder(params).generate(guided(build(grid=4, vocab=32, dim=32), params), cond, [5, 6, 7])
    assert torch.equal(again, first) and torch.equal(fresh.tokens, first)
    assert not torch.equal(other, first)
    RasterDecoder(params).generate(models, models.condition(PROMPTS[:2]), [5, 6])  # another batch size
    assert bundle.target.gpt.layers[0].attention.kv_cache is cache  # a view of the same store


def test_kv_cache_is_allocated_once_at_the_jobs_largest_shape() -> None:
    """engine.reserve allocates every GPT's cache at the job's largest batch (and tree, compiled):
    decodes of other batch sizes and decoders view the same memory, and decode what fresh caches
    decode."""
    params = SamplingParams(temperature=1.0, top_k=20, cfg_scale=2.0)
    bundle = build(grid=4, vocab=32, dim=32)
    cfg = compose_cfg(["decoder=[eagle2,raster]", "model=random"])
    decoders = [_build(cfg.decoder[name]) for name in ("eagle2", "raster")]
    engine.reserve(bundle, decoders, 3)
    gpt = bundle.target.gpt
    caches = [layer.attention.kv_cache for layer in gpt.layers]
    pointers = [(c.k_cache.data_ptr(), c.v_cache.data_ptr()) for c in caches]
    assert caches[0].capacity == (6, gpt.slots)  # 2 x 3 rows under guidance; eager: no scratch, no trash
    models = guided(bundle, params)
    for batch in (1, 3, 2):
        seeds = list(range(batch))
        got = RasterDecoder(params).generate(models, models.condition(PROMPTS[:batch]), seeds).tokens
        fresh = RasterDecoder(params).generate(guided(build(grid=4, vocab=32, dim=32), params),
                                               models.condition(PROMPTS[:batch]), seeds).tokens
        assert torch.equal(got, fresh), batch
        assert [layer.attention.kv_cache for layer in gpt.layers] == caches
        assert [(c.k_cache.data_ptr(), c.v_cache.data_ptr()) for c in caches] == pointers, batch
        assert caches[0].k_cache.shape[0] == 2 * batch
    assert decoders[0].cache_scratch >= cfg.decoder.eagle2.draft.total_tokens - 1  # the tree's nodes


def test_a_paper_protocol_asks_each_model_for_few_graph_widths(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The decoders of +experiment=paper_main on llamagen_tiny (eager, CPU), at the protocol's
    batch sizes: per model and batch, the bucketed widths are powers of two and at most
    graphs.width_buckets(widest forward) of them; in all within a model's graph budget."""
    from harness.models.gpt import GPT
    from harness.run import run
    from harness.runtime import graphs

    asked: dict[tuple[int, int], set[tuple[int, int]]] = {}
    widest: dict[tuple[int, int], int] = {}
    original_cached, original_width = GPT._cached, graphs.graph_width
    current: list[tuple[int, int]] = []

    def width(t: int) -> int:
        bucket = original_width(t)
        key = current[-1]
        asked.setdefault(key, set()).add((rows[-1], bucket))
        widest[key] = max(widest.get(key, 0), t)
        return bucket

    rows: list[int] = []

    def cached(self, x, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        current.append(self.cfg.grid)
        rows.append(x.shape[0])
        return original_cached(self, x, *args, **kwargs)

    monkeypatch.setattr(GPT, "_cached", cached)
    monkeypatch.setattr(graphs, "graph_width", width)
    cfg = compose_cfg(["+experiment=paper_main", "model=llamagen_tiny", "require_cuda=false", "evaluator=[speed]",
                       "dataset=shapes", "dataset_limit=5", "timing.images=4", "timing.reps=1",
                       "stages=[generate]", "decoder.mulo_sd.accept.k=16"])  # k 16 of 256 codes: rejections
    assert cfg.batch_size == 16
    run(cfg, tmp_path / "run")
    assert set(asked) == {(4, 4), (2, 2)}  # the 64 px target and the 32 px drafter
    for model, shapes in asked.items():
        by_rows: dict[int, set[int]] = {}
        for r, bucket in shapes:
            by_rows.setdefault(r, set()).add(bucket)
        assert set(by_rows) == {2, 32}  # the timed batch 1 and the protocol's batch 16, doubled by guidance
        for buckets in by_rows.values():
            assert all(b & (b - 1) == 0 for b in buckets)
            assert len(buckets) <= graphs.width_buckets(widest[model])
        assert len(shapes) <= graphs.GRAPH_BUDGET
    target = {b for _, b in asked[(4, 4)]}
    # raster 1, resample 2 and 3 -> 4, prefill 8, verify 16, tree 59 -> 64 (resampling needs rejected drafts:
    # llamagen_tiny's own operating point, k 1000 over its 256 codes, keeps every draft, hence k 16 above)
    assert target == {1, 2, 4, 8, 16, 64}
    assert {b for _, b in asked[(2, 2)]} == {1, 8}


def test_unknown_engine_is_refused() -> None:
    with pytest.raises(ConfigValueError, match="engine must be one of"):
        engine.check("fast", torch.device("cpu"))


def test_compiled_without_a_compiler_stops_before_generation(tmp_path: Path) -> None:
    env = {"CXX": str(tmp_path / "no-such-compiler"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "harness", "+experiment=smoke", "engine=compiled",
                          f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "C++ compiler" in out.stderr and "engine=eager" in out.stderr
    assert not (tmp_path / "run" / "samples").exists()


def _sampled(name: str, bundle, prompts: list[str], seeds: list[int], batch: int,
             stats: list | None = None) -> torch.Tensor:
    """Tokens [len(prompts), N] decoded `batch` at a time; per-image statistics into `stats`."""
    cfg = compose_cfg([f"decoder=[{name}]", "model=random"])
    decoder = _build(cfg.decoder[name])
    models = guided(bundle, decoder.sampling)
    out = []
    for i in range(0, len(prompts), batch):
        gen = decoder.generate(models, models.condition(prompts[i:i + batch]), seeds[i:i + batch])
        out.append(gen.tokens)
        if stats is not None:
            stats += [s.as_row() for s in gen.stats]
    return torch.cat(out)


@pytest.mark.parametrize("name", DECODERS)
def test_every_decoder_is_batch_independent_on_both_host_paths(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sampled decodes: batch 1 equals batch 4, and the accelerator path (no host reads: static
    widths, optional work done under a mask, the loop's check read one step late, so one step
    runs after every row finished) draws the very tokens and counts the very statistics of the
    CPU path."""
    bundle = build(grid=8, vocab=64, dim=64)
    prompts = [PROMPTS[i % 3] for i in range(4)]
    seeds = [11, 12, 13, 14]
    alone = _sampled(name, bundle, prompts, seeds, 1)
    cpu_stats: list = []
    together = _sampled(name, bundle, prompts, seeds, 4, cpu_stats)
    assert torch.equal(alone, together), name
    monkeypatch.setattr(hostsync, "reads_are_free", lambda device: False)
    accelerator_stats: list = []
    accelerator = _sampled(name, bundle, prompts, seeds, 4, accelerator_stats)
    assert torch.equal(accelerator, together), name
    assert accelerator_stats == cpu_stats, name
    assert len({tuple(t.tolist()) for t in together}) > 1  # not a degenerate model


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@CUDA
@pytest.mark.parametrize("name", DECODERS)
def test_on_cuda_every_decoder_is_batch_independent_with_the_lagged_loop_check(name: str) -> None:
    """On CUDA the loop reads "any row left" one step late (harness/hostsync.Running) and takes the
    static paths; a batch of 4 still equals 4 decodes at batch 1."""
    bundle = build(grid=8, vocab=64, dim=64).to("cuda")
    prompts = [PROMPTS[i % 3] for i in range(4)]
    seeds = [11, 12, 13, 14]
    assert torch.equal(_sampled(name, bundle, prompts, seeds, 1), _sampled(name, bundle, prompts, seeds, 4)), name


@pytest.fixture(scope="module")
def cuda_pair() -> tuple[object, object]:
    """An eager random bundle on CUDA and its compiled copy, shared by the per-decoder tests below
    (graphs compiled for one decoder serve the next)."""
    eager = build(grid=8, vocab=64, dim=64).to("cuda")
    compiled = copy.deepcopy(eager)
    engine.apply(compiled, "compiled", torch.device("cuda"))
    return eager, compiled


@pytest.mark.gpu
@CUDA
@pytest.mark.parametrize("name", DECODERS)
def test_on_cuda_compiled_and_eager_decode_the_same_greedy_tokens(name: str, cuda_pair: tuple) -> None:
    """One test per decoder: a run cut by its time limit still gives a verdict for every decoder it reached."""
    eager, compiled = cuda_pair
    assert torch.equal(_decode(name, compiled, [1, 2, 3]), _decode(name, eager, [1, 2, 3])), name


def test_an_eager_prefill_of_a_compiled_model_writes_what_the_eager_model_writes() -> None:
    """GPT.eager_prefill (benchmarks/engine.py's step table): the prefill runs op by op on the
    compiled model's cache layout (a trash slot past the slots) and gives the eager model's logits
    and keys; nothing is compiled for it."""
    eager = build(grid=4, vocab=64, dim=64)
    compiled = copy.deepcopy(eager)
    engine.apply(compiled, "compiled", torch.device("cpu"))
    compiled.target.gpt.eager_prefill = True
    engine.reserve(compiled, [], 2)
    shapes = engine.compiled_shapes()
    cond = eager.condition(PROMPTS[:2])
    with torch.inference_mode():
        eager.target.gpt.setup_cache(2)
        compiled.target.gpt.setup_cache(2)
        want = eager.target.gpt.prefill(cond)
        got = compiled.target.gpt.prefill(cond)
    assert engine.compiled_shapes() == shapes  # the compiled stack was never called
    torch.testing.assert_close(got, want)
    slots = eager.target.gpt.cfg.prefix_len
    kv_eager = eager.target.gpt.layers[0].attention.kv_cache.k_cache
    kv_compiled = compiled.target.gpt.layers[0].attention.kv_cache.k_cache
    assert kv_compiled.shape[2] > kv_eager.shape[2]  # the compiled layout has its trash slot
    torch.testing.assert_close(kv_compiled[:2, :, :slots], kv_eager[:2, :, :slots])


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_guidance_mixes_wide_logits_in_chunks_without_changing_tokens(dtype: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """MuLo-SD verifies the whole image in one forward; guidance mixes its logits LOGITS_CHUNK
    positions at a time (the model's own bf16 logits whole, float only per chunk): the tokens are
    those of the unchunked mix."""
    from harness.models import chunked_logits, guidance

    cfg = compose_cfg(["model=llamagen_tiny", "decoder=[mulo_sd,raster]", f"model.dtype={dtype}"])
    bundle = _build(cfg.model, drop=("name", "sampling"))
    tokens = {}
    for chunk in (3, 10**6):
        monkeypatch.setattr(chunked_logits, "LOGITS_CHUNK", chunk)
        for name in ("mulo_sd", "raster"):
            decoder = _build(cfg.decoder[name])
            models = guided(bundle, decoder.sampling)
            tokens[chunk, name] = decoder.generate(models, models.condition(PROMPTS), [1, 2, 3]).tokens
    for name in ("mulo_sd", "raster"):
        assert torch.equal(tokens[3, name], tokens[10**6, name]), name
    logits = torch.randn(4, 16, 8, dtype=getattr(torch, "bfloat16" if dtype == "bf16" else "float32"))
    monkeypatch.setattr(chunked_logits, "LOGITS_CHUNK", 3)
    mixed = guidance.Guided(bundle.target, 2.0)._mix(logits)
    whole = logits[2:].float() + 2.0 * (logits[:2].float() - logits[2:].float())
    assert mixed.dtype == torch.float32 and torch.equal(mixed, whole)
