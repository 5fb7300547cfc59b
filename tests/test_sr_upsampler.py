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
    identity = build_upsampler(kind="sr", network=str(_save(tmp_path, identity=True, name="id.safetensors")))
    assert torch.equal(identity.up(low, ctx), PixelUpsampler("nearest").up(low, ctx))
    other = build_upsampler(kind="sr", network=str(_save(tmp_path)))
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


def _standin_pin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scale: int = 2) -> Path:
    """A compact stand-in in the cache under the pinned name for `scale`, pinned to its own sha256
    (the publisher's file is not downloaded in tests)."""
    import hashlib

    from baselines.methods import sr_upsampler
    from harness.datasets.downloads import Pinned

    monkeypatch.setenv("MULO_BENCH_CACHE", str(tmp_path / "cache"))
    real = sr_upsampler.REALESRGAN[scale]
    target = tmp_path / "cache" / "data" / real.name
    target.parent.mkdir(parents=True)
    torch.manual_seed(0)
    state = compact(features=8, convs=2, scale=scale).state_dict()
    torch.save({"params": state}, target)  # Real-ESRGAN's release layout ({'params': state_dict})
    pin = Pinned(name=real.name, url="http://127.0.0.1:9/unreachable/" + real.name,
                 sha256=hashlib.sha256(target.read_bytes()).hexdigest(), what=real.what)
    monkeypatch.setitem(sr_upsampler.REALESRGAN, scale, pin)
    return target


def test_the_pinned_network_of_the_ratio_is_read_from_the_cache_and_checked(
        bundle: ModelBundle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.datasets.downloads import ChecksumError

    target = _standin_pin(tmp_path, monkeypatch)
    ctx = Context(models=bundle, cond=None, sampling=None, streams=None, device=torch.device("cpu"))
    low = torch.randint(0, 32, (2, 4, 4))
    assert build_upsampler(kind="sr", network="realesrgan").up(low, ctx).shape == (2, 8, 8)
    blob = target.read_bytes()
    target.write_bytes(blob[:-1] + bytes([blob[-1] ^ 1]))
    with pytest.raises(ChecksumError, match="RealESRGAN_x2plus.pth"):
        build_upsampler(kind="sr", network="realesrgan").up(low, ctx)


def test_a_ratio_without_a_pinned_network_is_refused_by_key() -> None:
    from baselines.methods.sr_upsampler import REALESRGAN, pinned_sr

    assert sorted(REALESRGAN) == [2, 4] and pinned_sr(4).name == "RealESRGAN_x4plus.pth"
    with pytest.raises(ValueError, match=r"draft.upsampler.network=realesrgan: no Real-ESRGAN network is pinned for x3"):
        pinned_sr(3)


@pytest.mark.parametrize("model, file", [("llamagen_xl_512", "RealESRGAN_x2plus.pth"),
                                         ("tar_1.5b_512", "RealESRGAN_x2plus.pth"),
                                         ("tar_7b_1024", "RealESRGAN_x4plus.pth"),
                                         ("lumina_mgpt_1024", "RealESRGAN_x2plus.pth"),
                                         ("emu3_gen", "RealESRGAN_x2plus.pth")])
def test_real_models_default_to_the_pinned_network_of_their_ratio(model: str, file: str) -> None:
    """mulo_sd on a real model: the sr up-sampler with the network of r (listed for stages=[fetch]);
    mulo_sd_bicubic: the bicubic resize, nothing to fetch."""
    from harness.assets.asset import UrlFile
    from harness.preflight import job_decoder_assets
    from tests.conftest import compose_cfg

    cfg = compose_cfg([f"model={model}", "decoder=[mulo_sd,mulo_sd_bicubic,mulo_sd_anchored]"])
    assert cfg.decoder.mulo_sd.draft.upsampler.kind == "sr"
    assert cfg.decoder.mulo_sd_bicubic.draft.upsampler.kind == "pixel"
    assets = job_decoder_assets(cfg)
    assert len(assets) == 1 and isinstance(assets[0], UrlFile) and assets[0].pinned.name == file
    assert "mulo_sd" in assets[0].what and "mulo_sd_anchored" in assets[0].what
    assert job_decoder_assets(cfg, ["mulo_sd_bicubic"]) == []


@pytest.mark.parametrize("model", ["shapes", "shapes_x2", "random", "llamagen_tiny", "tar_tiny"])
def test_shapes_worlds_and_stand_ins_keep_bicubic_and_fetch_nothing(model: str) -> None:
    from harness.preflight import job_decoder_assets
    from tests.conftest import compose_cfg

    cfg = compose_cfg([f"model={model}", "decoder=[mulo_sd]"])
    assert cfg.decoder.mulo_sd.draft.upsampler.kind == "pixel" and job_decoder_assets(cfg) == []
    if model.startswith("shapes"):  # kind=sr there reads the world's own trained network
        sr = compose_cfg([f"model={model}", "decoder=[mulo_sd]", "decoder.mulo_sd.draft.upsampler.kind=sr"])
        assert sr.decoder.mulo_sd.draft.upsampler.network == "shipped" and job_decoder_assets(sr) == []


def test_a_ratio_without_a_pinned_network_stops_the_job_before_building(tmp_path: Path) -> None:
    from harness import preflight
    from harness.api import ConfigValueError
    from tests.conftest import compose_cfg

    cfg = compose_cfg(["model=llamagen_xl_512", "decoder=[raster,mulo_sd]", "model.target_size=768"])
    with pytest.raises(ConfigValueError, match=r"decoder.mulo_sd.draft.upsampler.network=realesrgan: .* ratio x3"):
        preflight.check(cfg)
    bicubic = compose_cfg(["model=llamagen_xl_512", "decoder=[raster,mulo_sd_bicubic]", "model.target_size=768"])
    assert preflight.job_decoder_assets(bicubic) == []


def test_offline_the_missing_network_is_named_with_its_fetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness import preflight
    from harness.assets.fetching import MissingAssetsError
    from tests.conftest import compose_cfg

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MULO_BENCH_CACHE", str(tmp_path / "empty"))
    cfg = compose_cfg(["model=tar_1.5b_1024", "decoder=[mulo_sd]", "stages=[generate]"])
    monkeypatch.setattr("harness.assets.fetching.model_assets", lambda model: [])  # the model's own files: elsewhere
    with pytest.raises(MissingAssetsError, match=r"RealESRGAN_x4plus.pth from https://github.com/xinntao/Real-ESRGAN"):
        preflight.check_offline(cfg, [])
    (tmp_path / "empty" / "data").mkdir(parents=True)
    (tmp_path / "empty" / "data" / "RealESRGAN_x4plus.pth").write_bytes(b"fetched")
    preflight.check_offline(cfg, [])  # found (its bytes are checked when it is loaded)


def test_a_generate_job_downloads_a_missing_network_before_generating(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Online without a fetch stage, the pinned network comes down before the first decode (through
    the mirror here, a folder), checked against its pin; a second call downloads nothing."""
    from baselines.methods import sr_upsampler
    from harness import preflight
    from tests.conftest import compose_cfg

    standin = _standin_pin(tmp_path, monkeypatch)
    pin = sr_upsampler.REALESRGAN[2]  # the stand-in's pin
    mirror = tmp_path / "mirror"
    served = mirror / pin.url.split("://", 1)[1]
    served.parent.mkdir(parents=True)
    standin.rename(served)
    monkeypatch.setenv("MULO_BENCH_MIRROR", str(mirror))
    cfg = compose_cfg(["model=llamagen_xl_512", "decoder=[raster,mulo_sd]"])
    preflight.fetch_decoder_assets(cfg, ["raster", "mulo_sd"])
    assert (tmp_path / "cache" / "data" / pin.name).read_bytes() == served.read_bytes()
    served.unlink()
    preflight.fetch_decoder_assets(cfg, ["raster", "mulo_sd"])  # cached: the mirror is not asked
