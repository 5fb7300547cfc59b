"""The x2 shapes world: a 32x32-token target at 128 px whose r = 2 drafter is a 16x16 GPT at
64 px trained on from the x1 target. Its recipe stages start from the shipped x1 weights; its
manifest links the file it borrows from the x1 folder (the tokenizer) and checks its hash there;
its training batches are the same whether rendered in the training process or in worker
processes."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from baselines.methods.raster import RasterDecoder
from evaluators.geneval import ShapesBackend
from evaluators.geneval_rules import GenEvalRules
from harness.api import SamplingParams
from harness.datasets.prompts import shapes
from harness.run import guided
from harness.runtime.seeding import image_seed
from harness.shapes.bundle import load
from harness.shapes.recipe import (BORROWED, GPTS, SHIPPED_X2, WORLD_STAGES, adopt_shipped, finished, install,
                                   stage_order, weights_of)
from harness.shapes.train_gpt import StepData, step_batches
from harness.shapes.vq import load_tokenizer
from harness.shapes.weights import WEIGHTS_DIR, WORLDS, WeightsError, load_gpt, read_manifest, verified


def test_x2_stages_start_from_the_shipped_x1_weights(tmp_path: Path) -> None:
    """Without a working folder the x2 stages pull in the whole x1 chain; after adopt_shipped the
    chain stops at the adopted x1 stages, so only the three x2 stages train."""
    assert {"drafter", "target", "x2_target"} <= set(stage_order(WORLD_STAGES["x2"]))
    adopted = adopt_shipped(tmp_path)
    assert set(adopted) == {"target_parallel_refine", "drafter", "small_drafter"}
    assert stage_order(WORLD_STAGES["x2"], tmp_path) == [
        "target_parallel_refine", "x2_target", "small_drafter", "x2_small_drafter", "x2_drafter"]
    assert all(finished(tmp_path, s) for s in adopted)
    assert weights_of(tmp_path, "target_parallel_refine").read_bytes() == (WEIGHTS_DIR / "target.safetensors").read_bytes()
    assert adopt_shipped(tmp_path) == []  # a second call leaves the folder alone
    for stage in WORLD_STAGES["x2"]:  # the r = 2 drafter trains at half the target's 128 px
        assert GPTS[stage]["size"] == (64 if stage == SHIPPED_X2["drafter"] else 128)
        assert stage in SHIPPED_X2.values()
    assert "x2_target" not in WORLD_STAGES["x1"]


def test_training_batches_are_the_same_with_worker_processes() -> None:
    tokenizer = load_tokenizer(WEIGHTS_DIR / "tokenizer.safetensors")
    kwargs = dict(seed=3, size=64, batch_size=4, tokenizer=tokenizer, cond_dropout=0.1, focus_steps=1,
                  focus_tags=("colors",), tags=("single_object", "position"), captions="phrases",
                  named_order=True, grid=(16, 16), parallel_fraction=0.5, parallel_windows=(2, 8))
    here = list(step_batches(StepData(5, 9, **kwargs), workers=0))
    workers = list(step_batches(StepData(5, 9, **kwargs), workers=2))
    assert len(here) == len(workers) == 4
    for (c1, t1, g1), (c2, t2, g2) in zip(here, workers):
        assert torch.equal(t1, t2) and torch.equal(c1.ids, c2.ids) and torch.equal(c1.null, c2.null)
        assert [(b, r.tolist(), w) for b, r, w in g1] == [(b, r.tolist(), w) for b, r, w in g2]
    assert any(g for _, _, g in here), "no batch drew a parallel-decoding gap"
    # steps differ from each other (the stream is not one batch repeated)
    assert not torch.equal(here[0][1], here[1][1])


def _worlds(tmp_path: Path) -> tuple[Path, Path]:
    """Copies of the shipped x1 and x2 folders side by side, as in the package."""
    x1, x2 = tmp_path / WORLDS["x1"].name, tmp_path / WORLDS["x2"].name
    shutil.copytree(WORLDS["x1"], x1)
    shutil.copytree(WORLDS["x2"], x2)
    return x1, x2


def test_borrowed_files_are_hash_checked_in_the_folder_they_live_in(tmp_path: Path) -> None:
    x1, x2 = _worlds(tmp_path)
    files = read_manifest(x2)["files"]
    for name, (lender, lent) in BORROWED["x2"].items():
        assert files[name]["path"] == f"../{WORLDS[lender].name}/{lent}"
        assert not (x2 / name).exists()
        assert verified(name, x2).resolve() == (x1 / lent).resolve()
    assert set(BORROWED["x2"]) == {"tokenizer.safetensors"} and (x2 / "drafter.safetensors").is_file()
    data = bytearray((x1 / "tokenizer.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (x1 / "tokenizer.safetensors").write_bytes(bytes(data))
    with pytest.raises(WeightsError, match="weights_x2/../weights/tokenizer.safetensors is corrupt"):
        load(x2, world="x2")


def test_install_writes_the_x2_world_with_links_to_x1(tmp_path: Path) -> None:
    """install(world="x2") ships the three x2 stages in fp16 and links the tokenizer."""
    x1, _ = _worlds(tmp_path)
    out = tmp_path / "work"
    adopt_shipped(out, x1)
    for role, stage in SHIPPED_X2.items():  # the shipped file of each stage stands in for its training
        (out / stage).mkdir()
        shutil.copyfile(WORLDS["x2"] / f"{role}.safetensors", weights_of(out, stage))
    dest = tmp_path / "fresh" / WORLDS["x2"].name
    shutil.copytree(x1, dest.parent / x1.name)
    manifest = install(out, {s: {"stage": s} for s in WORLD_STAGES["x2"]}, dest, world="x2")
    assert set(manifest["files"]) == {"target.safetensors", "small_drafter.safetensors", "drafter.safetensors",
                                      "tokenizer.safetensors"}
    assert sorted(p.name for p in dest.iterdir()) == ["drafter.safetensors", "manifest.json",
                                                     "small_drafter.safetensors", "target.safetensors"]
    assert manifest["recipe"]["shipped"] == SHIPPED_X2 and set(manifest["recipe"]["gpts"]) == set(WORLD_STAGES["x2"])
    bundle = load(dest, world="x2")
    assert bundle.target.grid == (32, 32) and bundle.drafter.grid == (16, 16)


def test_x2_bundle_loads_with_the_documented_grids() -> None:
    bundle = load(world="x2")
    assert bundle.name == "shapes_x2"
    assert bundle.target.grid == (32, 32) and bundle.small_drafter.grid == (32, 32)
    assert bundle.drafter.grid == (16, 16)
    x1_target = load_gpt(WEIGHTS_DIR / "target.safetensors").state_dict()  # the drafter's start
    drafter = bundle.drafter.gpt.state_dict()
    assert drafter.keys() == x1_target.keys()
    assert not all(torch.equal(value, x1_target[name]) for name, value in drafter.items())
    with pytest.raises(ValueError, match="shapes world must be one of"):
        load(world="x4")
    total = sum(entry["bytes"] for name, entry in read_manifest(WORLDS["x2"])["files"].items()
                if "path" not in entry)
    assert total <= 18 * 2**20, f"x2 weights are {total / 2**20:.1f} MiB"


@pytest.mark.long
def test_x2_target_samples_score_above_a_floor() -> None:
    """A short raster run of the shipped x2 target (1024 tokens per image) on 12 prompts (2 per
    GenEval tag) with the model's CFG scale. On the first 96 prompts at seed 0 it scores 0.82
    (raster, cfg 1.5). The floor catches broken weights, a broken link to the x1 files and a
    decode path that does not reach 128 px."""
    prompts = shapes(12)
    params = SamplingParams(temperature=1.0, cfg_scale=1.5)
    models = guided(load(world="x2", small_drafter=False), params)
    cond = models.condition([p.text for p in prompts])
    tokens = RasterDecoder(params).generate(models, cond, [image_seed(0, p.id, 0) for p in prompts]).tokens
    images = models.target.decode(tokens).permute(0, 2, 3, 1).numpy()
    assert images.shape == (12, 128, 128, 3)
    rules = GenEvalRules()
    correct = [rules.evaluate(d, p.meta)[0] for d, p in zip(ShapesBackend().detect(list(images)), prompts)]
    assert float(np.mean(correct)) >= 0.6, f"x2 target scores {np.mean(correct):.2f} on 12 prompts"


@pytest.mark.parametrize("objective", ["ce", "pixel", "gan"])
def test_learned_upsampler_takes_the_weights_trained_for_the_targets_grid(objective: str) -> None:
    """`weights: shipped` resolves by the target's grid: the x1 world's 16x16 weights on model=shapes,
    the 32x32 ones (trained at 128 px) on model=shapes_x2; weights of one grid refuse the other."""
    from baselines.framework.canvas import Context
    from baselines.methods.latent_upsampler import load_upsampler
    from baselines.methods.upsamplers import LearnedUpsampler, shipped_weights

    for world, grid in (("x1", (16, 16)), ("x2", (32, 32))):
        bundle = load(world=world, small_drafter=False)
        ctx = Context(models=bundle, cond=None, sampling=SamplingParams(), streams=None,
                      device=torch.device("cpu"))
        up = LearnedUpsampler("shipped", objective)
        assert up.module(ctx).grid == grid
        low = torch.randint(bundle.target.codebook.shape[0], (2, grid[0] // 2, grid[1] // 2),
                            generator=torch.Generator().manual_seed(0))
        high = up.up(low, ctx)
        assert high.shape == (2, *grid) and up.down(high, ctx).shape == low.shape
    x1 = load_upsampler(shipped_weights(objective, (16, 16)))
    with pytest.raises(ValueError, match="trained for a 16x16 high-res grid; this target's grid is 32x32"):
        x1.check(bundle.target.codebook.detach().float().cpu(), 2, (32, 32))
    with pytest.raises(ValueError, match="none is shipped for a 8x8 grid"):
        tiny = load(world="x1", small_drafter=False)
        tiny.target.grid = (8, 8)  # a target no up-sampler was trained for
        LearnedUpsampler("shipped", objective).module(Context(models=tiny, cond=None, sampling=SamplingParams(),
                                                               streams=None, device=torch.device("cpu")))
