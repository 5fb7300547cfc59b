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


@pytest.mark.skipif(engine.unavailable(torch.device("cpu")) is not None, reason="no C++ compiler for inductor")
def test_compiled_and_eager_decode_the_same_greedy_tokens_for_every_decoder() -> None:
    eager = build(grid=8, vocab=64, dim=64)
    compiled = copy.deepcopy(eager)
    assert engine.apply(compiled, "compiled", torch.device("cpu")) == 3  # target, drafter, small drafter
    for name in DECODERS:
        want = _decode(name, eager, [1, 2, 3])
        got = _decode(name, compiled, [1, 2, 3])
        assert torch.equal(got, want), name
    assert engine.compiled_shapes() > 0


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
    assert bundle.target.gpt.layers[0].attention.kv_cache is not cache


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


@pytest.mark.gpu
@CUDA
def test_on_cuda_compiled_and_eager_decode_the_same_greedy_tokens() -> None:
    eager = build(grid=8, vocab=64, dim=64).to("cuda")
    compiled = copy.deepcopy(eager)
    engine.apply(compiled, "compiled", torch.device("cuda"))
    for name in DECODERS:
        assert torch.equal(_decode(name, compiled, [1, 2, 3]), _decode(name, eager, [1, 2, 3])), name
