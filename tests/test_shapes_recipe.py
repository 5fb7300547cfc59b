"""The shapes-world training recipe's stage graph and its install step (stage -> shipped role)."""
from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from harness.models.condition import TextCondition
from harness.shapes.gpt import ShapesConfig, ShapesGPT
from harness.shapes.captions import MAX_PHRASES, MAX_WORDS, PHRASES
from harness.shapes.recipe import GPTS, SHIPPED, install, stage_order, weights_of
from harness.shapes.train_gpt import CAPTION_TENSORS, batch, initialise_from, save_gpt, train_gpt
from harness.shapes.vq import load_tokenizer
from harness.shapes.weights import WEIGHTS_DIR, load_gpt, read_manifest

ARCH = ("dim", "n_layer", "n_head", "cond_broadcast", "rope_fraction")


def test_every_stage_starts_after_the_stage_it_starts_from() -> None:
    order = stage_order(list(GPTS))
    assert sorted(order) == sorted(GPTS)
    for stage, spec in GPTS.items():
        parent = spec.get("init_from")
        if parent is not None:
            assert order.index(parent) < order.index(stage)
            # init_from loads strictly: the parent must have the same architecture
            assert all(GPTS[parent].get(k) == spec.get(k) for k in ARCH), (stage, parent)
    # asking for one stage brings the chain it needs, parents first
    assert stage_order(["target_refine"]) == ["drafter", "target", "target_refine"]
    assert stage_order(["target", "small_drafter"]) == ["drafter", "target", "small_drafter"]


def test_every_shipped_role_comes_from_a_stage_of_that_role() -> None:
    assert set(SHIPPED) == {"target", "drafter", "small_drafter"}
    for role, stage in SHIPPED.items():
        assert GPTS[stage]["role"] == role


def test_install_ships_each_role_from_its_stage(tmp_path: Path) -> None:
    """A working folder whose stages hold distinguishable weights: install must copy the shipped
    stage of each role (not an earlier stage of the same role) and hash what it wrote."""
    out = tmp_path / "work"
    (out / "tokenizer").mkdir(parents=True)
    shutil.copyfile(WEIGHTS_DIR / "tokenizer.safetensors", out / "tokenizer" / "tokenizer.safetensors")
    for stage, spec in GPTS.items():
        (out / stage).mkdir()
        source = WEIGHTS_DIR / f"{spec['role']}.safetensors"
        shutil.copyfile(source, weights_of(out, stage))
    earlier = [s for s in GPTS if GPTS[s]["role"] == "target" and s != SHIPPED["target"]]
    assert earlier, "the recipe refines the target in a later stage"
    for stage in earlier:  # zero an earlier target stage: shipping it would be visible
        gpt = load_gpt(weights_of(out, stage))
        for p in gpt.parameters():
            p.data.zero_()
        save_gpt(gpt, weights_of(out, stage), {})
    dest = tmp_path / "dest"
    metrics = {stage: {"stage": stage} for stage in GPTS}
    manifest = install(out, metrics, dest=dest)
    assert set(manifest["files"]) == {"tokenizer.safetensors"} | {f"{r}.safetensors" for r in SHIPPED}
    shipped = load_gpt(dest / "target.safetensors")
    assert any(p.abs().sum() > 0 for p in shipped.parameters())
    expected = load_gpt(weights_of(out, SHIPPED["target"]))
    for a, b in zip(shipped.state_dict().values(), expected.state_dict().values()):
        assert torch.equal(a, b.to(a.dtype))
    assert read_manifest(dest)["recipe"]["shipped"] == SHIPPED


@pytest.mark.parametrize("tags", [("colours",), ()])
def test_a_caption_mix_outside_the_six_tags_is_refused(tags: tuple[str, ...]) -> None:
    tokenizer = load_tokenizer(WEIGHTS_DIR / "tokenizer.safetensors")
    with pytest.raises(ValueError, match="tags must be a non-empty subset"):
        batch(0, 0, 32, 2, tokenizer, 0.0, tags)


def _save_tiny(path: Path) -> ShapesGPT:
    torch.manual_seed(0)
    gpt = ShapesGPT(ShapesConfig(vocab_size=32, grid=(4, 4), dim=32, n_layer=1, n_head=4, prefix_len=3, caption_dim=16,
                        word_vocab=11, prefix_rope="zero")).eval()
    torch.nn.init.normal_(gpt.output.weight, std=0.2)
    save_gpt(gpt, path, {})
    return gpt


@torch.inference_mode()
def test_a_stage_may_grow_zero_slot_embeddings_and_nothing_else(tmp_path: Path) -> None:
    parent = _save_tiny(tmp_path / "parent.safetensors")
    child = ShapesGPT(replace(parent.cfg, word_pos=True)).eval()
    initialise_from(child, tmp_path / "parent.safetensors")
    cond = TextCondition(null=torch.zeros(2, dtype=torch.bool), ids=torch.tensor([[1, 2, 3], [4, 5, 6]]))
    tokens = torch.randint(0, 32, (2, 16), generator=torch.Generator().manual_seed(0))
    # zero slot embeddings: the grown child computes exactly what its parent did
    torch.testing.assert_close(child.forward_train(cond, tokens), parent.forward_train(cond, tokens))
    wider = ShapesGPT(replace(parent.cfg, cond_broadcast=True))
    with pytest.raises(ValueError, match="missing.*cond_broadcast"):
        initialise_from(wider, tmp_path / "parent.safetensors")
    other = ShapesGPT(replace(parent.cfg, dim=64))
    with pytest.raises(ValueError, match="does not fit this GPT"):
        initialise_from(other, tmp_path / "parent.safetensors")



@torch.inference_mode()
def test_a_stage_on_another_caption_encoding_inherits_all_but_the_caption_tensors(tmp_path: Path) -> None:
    parent = _save_tiny(tmp_path / "parent.safetensors")
    child = ShapesGPT(replace(parent.cfg, prefix_len=2, word_vocab=7, word_pos=True)).eval()
    before = {k: v.clone() for k, v in child.state_dict().items()}
    initialise_from(child, tmp_path / "parent.safetensors")
    inherited = parent.state_dict()
    for name, value in child.state_dict().items():
        if name in CAPTION_TENSORS:
            assert torch.equal(value, before[name]), name  # started afresh
        elif name in inherited:
            assert torch.equal(value, inherited[name]), name
    assert {n for n in CAPTION_TENSORS if n in child.state_dict()} == {
        "word_embeddings.weight", "word_pos", "cls_embedding.uncond_embedding"}
    deeper = ShapesGPT(replace(parent.cfg, prefix_len=2, word_vocab=7, n_layer=2))
    with pytest.raises(ValueError, match="missing.*layers.1"):
        initialise_from(deeper, tmp_path / "parent.safetensors")


def test_training_batches_follow_the_caption_encoding() -> None:
    tokenizer = load_tokenizer(WEIGHTS_DIR / "tokenizer.safetensors")
    words, tokens = batch(3, 0, 32, 4, tokenizer, 0.0)
    phrases, same = batch(3, 0, 32, 4, tokenizer, 0.0, captions="phrases")
    assert torch.equal(tokens, same)
    assert words.ids.shape == (4, MAX_WORDS) and phrases.ids.shape == (4, MAX_PHRASES)
    assert int(phrases.ids.max()) < len(PHRASES)


def test_parallel_fraction_reaches_the_training_step(tmp_path: Path) -> None:
    """Two steps of a tiny target from the same seed: with every row trained on parallel-decoding
    gaps the weights differ from a causal-only run, and the metrics record the masks."""
    tokenizer = WEIGHTS_DIR / "tokenizer.safetensors"
    runs = {}
    for fraction in (0.0, 1.0):
        metrics = train_gpt("target", tokenizer, tmp_path / str(fraction), steps=2, batch_size=4, dim=32,
                            n_layer=1, n_head=2, warmup=1, captions="phrases", parallel_fraction=fraction,
                            parallel_windows=(2,), bf16=False)
        assert metrics["parallel_fraction"] == fraction and metrics["parallel_windows"] == [2]
        runs[fraction] = load_gpt(tmp_path / str(fraction) / "target.safetensors").state_dict()
    differ = [k for k in runs[0.0] if not torch.equal(runs[0.0][k], runs[1.0][k])]
    assert "output.weight" in differ
