"""MuLo-SD's `sr` up-sampler (baselines/methods/sr_upsampler.py): strict spandrel loading and the
decode -> network -> encode round trip on the random stand-in."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from baselines.framework.canvas import Context
from baselines.methods.sr_upsampler import load_sr
from baselines.methods.upsamplers import PixelUpsampler, build_upsampler
from harness.api import ModelBundle
from harness.models.random.bundle import build
from tests.single_thread import single_thread  # noqa: F401  (autouse)

pytest.importorskip("spandrel")
from baselines.training.train_sr import compact  # noqa: E402  (needs spandrel)


@pytest.fixture(scope="module")
def bundle() -> ModelBundle:
    return build(grid=8, vocab=32, dim=32)  # target 8 x 8, drafter 4 x 4 (r = 2)


def _save(tmp_path: Path, scale: int = 2, name: str = "net.safetensors", identity: bool = False) -> Path:
    torch.manual_seed(0)
    net = compact(features=8, convs=2, scale=scale)
    state = {k: v.detach().clone().contiguous() for k, v in net.state_dict().items()}
    if identity:  # the last convolution gives 0: the network returns its nearest-up-sampled input
        last = max(int(k.split(".")[1]) for k in state if k.startswith("body."))
        state[f"body.{last}.weight"].zero_()
        state[f"body.{last}.bias"].zero_()
    path = tmp_path / name
    save_file(state, str(path))
    return path


def test_a_checkpoint_of_the_right_scale_loads(tmp_path: Path) -> None:
    net = load_sr(_save(tmp_path), scale=2)
    assert net(torch.rand(1, 3, 8, 8)).shape == (1, 3, 16, 16)


def test_a_wrong_scale_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"is a x4 network .* need x2"):
        load_sr(_save(tmp_path, scale=4), scale=2)


def test_a_missing_key_is_refused(tmp_path: Path) -> None:
    path = _save(tmp_path)
    state = load_file(str(path))
    del state["body.2.weight"]  # a body convolution: the architecture is detected, the load is not strict
    save_file(state, str(path))
    with pytest.raises(ValueError, match="does not load strictly"):
        load_sr(path, scale=2)
    del state["body.1.weight"]  # a key spandrel detects the architecture by
    save_file(state, str(path))
    with pytest.raises(ValueError, match="no super-resolution network spandrel recognises"):
        load_sr(path, scale=2)
    with pytest.raises(ValueError, match="does not exist"):
        load_sr(tmp_path / "absent.pth", scale=2)


def test_round_trip_on_the_stand_in_equals_nearest_pixel_resizing_for_an_identity_network(
        bundle: ModelBundle, tmp_path: Path) -> None:
    """A network whose residual is 0 returns the nearest-up-sampled image: then decode -> network ->
    encode is exactly the pixel up-sampler with nearest resizing; a trained-like (random) one
    gives valid tokens of the target's grid, and its down-sampler returns the drafter's grid."""
    ctx = Context(models=bundle, cond=None, sampling=None, streams=None, device=torch.device("cpu"))
    low = torch.randint(0, 32, (3, 4, 4))
    identity = build_upsampler(kind="sr", weights=str(_save(tmp_path, identity=True, name="id.safetensors")))
    assert torch.equal(identity.up(low, ctx), PixelUpsampler("nearest").up(low, ctx))
    other = build_upsampler(kind="sr", weights=str(_save(tmp_path)))
    high = other.up(low, ctx)
    assert high.shape == (3, 8, 8) and int(high.min()) >= 0 and int(high.max()) < 32
    assert other.down(high, ctx).shape == (3, 4, 4)


def test_shipped_networks_are_checked_against_their_manifest(bundle: ModelBundle, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from baselines.methods import sr_upsampler
    from baselines.training.train_sr import MANIFEST_NAME, record

    path = _save(tmp_path, name="sr_compact_8x8.safetensors")
    record(path, {"world": "test"})
    monkeypatch.setattr(sr_upsampler, "MANIFEST", tmp_path / MANIFEST_NAME)
    monkeypatch.setattr(sr_upsampler, "shipped_sr", lambda grid: tmp_path / f"sr_compact_{grid[0]}x{grid[1]}.safetensors")
    ctx = Context(models=bundle, cond=None, sampling=None, streams=None, device=torch.device("cpu"))
    low = torch.randint(0, 32, (1, 4, 4))
    assert build_upsampler(kind="sr").up(low, ctx).shape == (1, 8, 8)
    blob = path.read_bytes()
    path.write_bytes(blob[:-1] + bytes([blob[-1] ^ 1]))  # one bit of the last byte
    with pytest.raises(ValueError, match="damaged"):
        build_upsampler(kind="sr").up(low, ctx)


@pytest.mark.parametrize("grid", [(16, 16), (32, 32)])
def test_the_shipped_shapes_networks_load_strictly_as_x2(grid: tuple[int, int]) -> None:
    from baselines.methods.sr_upsampler import _checked, shipped_sr

    path = _checked(shipped_sr(grid))
    assert path.stat().st_size < 1_000_000
    net = load_sr(path, scale=2)
    assert net(torch.rand(1, 3, grid[0] * 2, grid[1] * 2)).shape == (1, 3, grid[0] * 4, grid[1] * 4)
    with pytest.raises(ValueError, match="need x4"):
        load_sr(path, scale=4)
