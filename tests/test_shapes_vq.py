"""ShapesVQ tokenizer and its training recipe: shapes, codebook, straight-through gradients,
bit-exact resume, strict loading."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from harness.shapes import train_tokenizer as tt
from harness.shapes.vq import ShapesVQ, load_tokenizer, save_tokenizer, to_float

TINY = {"codebook_size": 16, "code_dim": 4, "channels": (8, 8, 8), "res_blocks": 1}


@pytest.fixture(autouse=True)
def _threads():
    before = torch.get_num_threads()
    torch.set_num_threads(min(2, before))
    yield
    torch.set_num_threads(before)


def _images(b: int, size: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (b, 3, size, size), dtype=torch.uint8, generator=g)


@pytest.mark.parametrize("size", [64, 32])
def test_encode_decode_shapes(size: int) -> None:
    torch.manual_seed(0)
    model = ShapesVQ().eval()
    tokens = model.encode(_images(2, size))
    assert tokens.shape == (2, size // 4, size // 4) and tokens.dtype == torch.int64
    assert 0 <= int(tokens.min()) and int(tokens.max()) < 512
    images = model.decode(tokens)
    assert images.shape == (2, 3, size, size) and images.dtype == torch.uint8
    z = model.codebook[tokens].permute(0, 3, 1, 2)
    out = model.decode_codes(z)
    assert out.shape == (2, 3, size, size) and out.is_floating_point()


def test_default_model_is_small() -> None:
    # 1.01M with the conv encoder, 0.55M with the patch encoder of the shipped weights
    assert sum(p.numel() for p in ShapesVQ().parameters()) < 1_050_000
    assert sum(p.numel() for p in ShapesVQ(encoder="patch").parameters()) < 600_000


def test_patch_encoder_tokens_depend_only_on_their_own_patch() -> None:
    """Changing pixels outside one 4x4 patch never changes that patch's token (patch encoder);
    the conv encoder's tokens do depend on neighbours (so the check can fail)."""
    images = _images(4, 32, seed=1)
    edited = images.clone()
    edited[:, :, :, 8:] = 255 - edited[:, :, :, 8:]  # every column from token column 2 on
    for encoder, local in (("patch", True), ("conv", False)):
        torch.manual_seed(0)
        model = ShapesVQ(**{**TINY, "encoder": encoder}).eval()
        with torch.no_grad():  # compare latents: codes of a tiny codebook can coincide by chance
            before, after = model.encoder(to_float(images)), model.encoder(to_float(edited))
        same = torch.equal(before[..., :2], after[..., :2])
        assert same is local, encoder
    with pytest.raises(ValueError, match="encoder must be"):
        ShapesVQ(encoder="vit")


def test_flat_patches_share_one_token_anywhere() -> None:
    """A flat background patch gets the same code at every position (patch encoder)."""
    torch.manual_seed(0)
    model = ShapesVQ(encoder="patch").eval()
    image = torch.full((1, 3, 32, 32), 150, dtype=torch.uint8)
    image[:, :, 12:20, 12:20] = torch.tensor([230, 25, 25], dtype=torch.uint8)[:, None, None]
    tokens = model.encode(image)[0]
    background = torch.ones(8, 8, dtype=torch.bool)
    background[3:5, 3:5] = False
    assert tokens[background].unique().numel() == 1
    assert tokens[~background].unique().numel() == 1 and tokens[3, 3] != tokens[0, 0]


def test_bad_inputs_raise() -> None:
    model = ShapesVQ(**TINY)
    with pytest.raises(ValueError, match="divisible by 4"):
        model.encode(_images(1, 30))
    with pytest.raises(TypeError, match="uint8"):
        model.encode(_images(1, 32).float())
    with pytest.raises(ValueError, match="token ids"):
        model.decode(torch.full((1, 8, 8), 16))


def test_codebook_shape_and_normalisation() -> None:
    model = ShapesVQ()
    codes = model.codebook
    assert codes.shape == (512, 8)
    torch.testing.assert_close(codes.norm(dim=1), torch.ones(512))


def test_straight_through_gradient() -> None:
    torch.manual_seed(0)
    model = ShapesVQ(**TINY)
    x = to_float(_images(2, 32)).requires_grad_()
    recon, losses, indices = model(x)
    assert recon.shape == x.shape and indices.shape == (2, 8, 8)
    assert set(losses) == {"codebook", "commit"}
    # the decoder input is exactly the chosen codes: recompute from the indices
    z = model.codebook[indices].permute(0, 3, 1, 2)
    torch.testing.assert_close(model.decode_codes(z), recon)
    recon.square().mean().backward(retain_graph=True)
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert model.encoder.net[0].weight.grad.abs().sum() > 0
    assert model.embedding.weight.grad is None  # reconstruction alone does not move the codes
    model.zero_grad()
    (losses["codebook"] + losses["commit"]).backward()
    assert model.embedding.weight.grad.abs().sum() > 0


def _train(out: Path, **overrides) -> dict:
    kwargs = dict(steps=4, batch_size=4, seed=3, lr=1e-2, log_every=1, ckpt_every=2,
                  channels=TINY["channels"], codebook_size=TINY["codebook_size"],
                  code_dim=TINY["code_dim"], restart_every=2, warmup=1, eval_images=0, active_images=8)
    kwargs.update(overrides)
    return tt.train_tokenizer(out, **kwargs)


def test_resume_is_bit_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _train(tmp_path / "straight")

    real_batch = tt.training_batch

    def crash_at_step_2(seed: int, step: int, n: int, size: int) -> torch.Tensor:
        if step == 2:
            raise KeyboardInterrupt("simulated crash")
        return real_batch(seed, step, n, size)

    monkeypatch.setattr(tt, "training_batch", crash_at_step_2)
    with pytest.raises(KeyboardInterrupt):
        _train(tmp_path / "resumed")
    assert torch.load(tmp_path / "resumed" / tt.CHECKPOINT, weights_only=False)["step"] == 2
    monkeypatch.setattr(tt, "training_batch", real_batch)
    _train(tmp_path / "resumed")

    a = load_file(str(tmp_path / "straight" / tt.WEIGHTS))
    b = load_file(str(tmp_path / "resumed" / tt.WEIGHTS))
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    ca = torch.load(tmp_path / "straight" / tt.CHECKPOINT, weights_only=False)
    cb = torch.load(tmp_path / "resumed" / tt.CHECKPOINT, weights_only=False)
    assert torch.equal(ca["last_used"], cb["last_used"])
    assert torch.equal(ca["restart_rng"], cb["restart_rng"])
    for sa, sb in zip(ca["optimizer"]["state"].values(), cb["optimizer"]["state"].values()):
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not list((tmp_path / "resumed").glob("*.tmp"))


def test_resume_refuses_other_settings(tmp_path: Path) -> None:
    _train(tmp_path, steps=2)
    with pytest.raises(ValueError, match="other settings"):
        _train(tmp_path, steps=2, lr=5e-3)


def test_strict_loading(tmp_path: Path) -> None:
    model = ShapesVQ(**TINY)
    state = model.state_dict()
    missing = {k: v for k, v in state.items() if k != "embedding.weight"}
    with pytest.raises(RuntimeError, match="Missing key"):
        ShapesVQ(**TINY).load_state_dict(missing)
    with pytest.raises(RuntimeError, match="Unexpected key"):
        ShapesVQ(**TINY).load_state_dict({**state, "extra": torch.zeros(1)})
    with pytest.raises(RuntimeError, match="size mismatch"):
        ShapesVQ(**{**TINY, "codebook_size": 32}).load_state_dict(state)

    path = tmp_path / "tok.safetensors"
    save_tokenizer(model, path)
    loaded = load_tokenizer(path)
    images = _images(2, 32)
    assert torch.equal(loaded.encode(images), model.eval().encode(images))
    tensors = load_file(str(path))
    tensors["extra"] = torch.zeros(1)
    save_file(tensors, str(tmp_path / "bare.safetensors"))
    with pytest.raises(ValueError, match="config"):
        load_tokenizer(tmp_path / "bare.safetensors")
    save_file(tensors, str(tmp_path / "extra.safetensors"),
              metadata={"config": '{"codebook_size": 16, "code_dim": 4, "channels": [8, 8, 8], '
                                  '"res_blocks": 1}'})
    with pytest.raises(RuntimeError, match="Unexpected key"):
        load_tokenizer(tmp_path / "extra.safetensors")


def test_metrics_on_perfect_and_broken_reconstructions() -> None:
    images = tt.training_batch(0, 0, 4, 32)
    perfect = tt.reconstruction_metrics(images, images)
    assert perfect["palette_acc"] == 1.0 and perfect["colour_iou_min"] == 1.0
    grey = torch.full_like(images, 150)
    broken = tt.reconstruction_metrics(images, grey)
    assert broken["palette_acc"] < 1.0 and broken["colour_iou_min"] == 0.0
    edges = tt.edge_mask(to_float(images))
    assert edges.shape == (4, 1, 32, 32) and edges.any()


def test_cli_writes_weights_metrics_and_grids(tmp_path: Path) -> None:
    tt.main(["--out", str(tmp_path), "--steps", "2", "--batch-size", "4", "--channels", "8", "8",
             "8", "--eval-images", "4", "--log-every", "1", "--ckpt-every", "1", "--threads", "1",
             "--active-images", "4"])
    model = load_tokenizer(tmp_path / tt.WEIGHTS)
    assert model.codebook.shape == (512, 8)
    assert 0 < int(model.active.sum()) < 512  # 4 renders per size use a fraction of the codes
    metrics = (tmp_path / tt.METRICS).read_text()
    assert '"palette_acc"' in metrics and '"64"' in metrics and '"32"' in metrics
    assert (tmp_path / "recon_64.png").exists() and (tmp_path / "recon_32.png").exists()


def test_batch_must_hold_both_resolutions(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="each of 64 and 32 px"):
        _train(tmp_path, batch_size=4, low_res_share=1.0)


def test_restricted_encoder_emits_only_active_codes() -> None:
    from harness.shapes.weights import WEIGHTS_DIR

    model = load_tokenizer(WEIGHTS_DIR / "tokenizer.safetensors")
    images = tt.render_batch(np.random.default_rng(0), 4, 32)
    before = model.encode(images)
    used = before.unique()
    assert len(used) > 2
    active = torch.zeros(model.codebook_size, dtype=torch.bool)
    active[used[: len(used) // 2]] = True  # keep half of the codes these images use
    model.restrict(active)
    after = model.encode(images)
    assert active[after].all() and not torch.equal(after, before)
    kept = active[before]
    assert torch.equal(after[kept], before[kept])  # a token whose code stays active is unchanged
    with pytest.raises(ValueError, match="non-empty bool mask"):
        model.restrict(torch.zeros(model.codebook_size, dtype=torch.bool))


def test_shipped_tokenizer_restriction_keeps_training_tokens() -> None:
    """The shipped encoder is restricted to the codes real renders use; on fresh renders (the
    GPTs' training distribution) it must give exactly the unrestricted tokens."""
    from harness.shapes.weights import WEIGHTS_DIR

    model = load_tokenizer(WEIGHTS_DIR / "tokenizer.safetensors")
    assert 0 < int(model.active.sum()) < model.codebook_size
    for size in (64, 32):
        images = tt.render_batch(np.random.default_rng([7, size]), 64, size)
        restricted = model.encode(images)
        active = model.active.clone()
        model.active.fill_(True)
        free = model.encode(images)
        model.active.copy_(active)
        assert torch.equal(restricted, free), size
