"""MuLo-SD's `sr` up-sampler (paper.md §4, the CVPR version's default path): tokenizer decode ->
an off-the-shelf super-resolution network -> tokenizer encode; the down-sampler is the `pixel`
one's (decode -> anti-aliased bilinear resize -> encode).

The network is read with spandrel, which detects the architecture from the checkpoint's keys
(Real-ESRGAN's RRDB and compact SRVGG, SwinIR, HAT, ...), strictly: a file spandrel does not
recognise, a state dict with missing or unexpected keys, a network that is not RGB-to-RGB, or one
whose scale is not the models' ratio r (target grid / drafter grid) is refused with a ValueError
naming the file and the fix. Images enter it as float RGB in [0, 1] and leave it clamped and
rounded to uint8.

The network (`network`): "realesrgan" (the real models' default) is Real-ESRGAN's general-purpose
network of the models' ratio, RealESRGAN_x2plus for r = 2 (256 -> 512 px drafts, 512 -> 1024 px on
Lumina-mGPT) and RealESRGAN_x4plus for r = 4 (256 -> 1024 px), the publisher's release files
pinned by sha256 (`REALESRGAN`), fetched by `stages=[fetch]` into $MULO_BENCH_CACHE/data and
checked at load; another ratio has no pinned network and is refused. "shipped" reads
baselines/weights/sr_compact_<rows>x<cols>.safetensors for the target's token grid (the shapes
worlds' networks trained by baselines/training/train_sr.py, listed with their sha256 in
baselines/weights/sr_manifest.json, checked at load); any other value is a path to a checkpoint
(.pth, .pt, .safetensors) spandrel reads.
"""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import torch
from torch import Tensor, nn

from baselines.framework.canvas import Context
from baselines.methods.upsamplers import WEIGHTS_DIR, PixelUpsampler, ratio
from harness.datasets.downloads import Pinned, fetch

log = logging.getLogger(__name__)

MANIFEST = WEIGHTS_DIR / "sr_manifest.json"
EXTRA = "pip install 'mulo-bench[sr]' (spandrel)"
PINNED = "realesrgan"  # `network` value: the pinned Real-ESRGAN network of the models' ratio
_RELEASES = "https://github.com/xinntao/Real-ESRGAN/releases/download"
# Real-ESRGAN's general-purpose RRDB networks (Wang et al., 2021; BSD-3-Clause), per scale: the files of
# the publisher's GitHub releases, with their sha256 (x2plus: 67,061,725 bytes, also the LFS object of
# hub nateraw/real-esrgan @42efb9c3; x4plus: 67,040,989 bytes)
REALESRGAN = {
    2: Pinned(name="RealESRGAN_x2plus.pth", url=f"{_RELEASES}/v0.2.1/RealESRGAN_x2plus.pth",
              sha256="49fafd45f8fd7aa8d31ab2a22d14d91b536c34494a5cfe31eb5d89c2fa266abb",
              what="MuLo-SD's sr up-sampler network (Real-ESRGAN x2plus)"),
    4: Pinned(name="RealESRGAN_x4plus.pth", url=f"{_RELEASES}/v0.1.0/RealESRGAN_x4plus.pth",
              sha256="4fa0d38905f75ac06eb49a7951b426670021be3018265fd191d2125df9d682f1",
              what="MuLo-SD's sr up-sampler network (Real-ESRGAN x4plus)"),
}


def pinned_sr(scale: int) -> Pinned:
    """The pinned Real-ESRGAN network for ratio `scale`.

    Raises:
        ValueError: no network is pinned for this ratio (naming the key and the fix).
    """
    if scale not in REALESRGAN:
        raise ValueError(f"decoder draft.upsampler.network={PINNED}: no Real-ESRGAN network is pinned for x{scale} "
                         f"(the models' ratio r; pinned: {', '.join(f'x{s}' for s in sorted(REALESRGAN))}); give "
                         f"draft.upsampler.network=PATH (a x{scale} spandrel checkpoint) or draft.upsampler.kind=pixel")
    return REALESRGAN[scale]


def shipped_sr(grid: tuple[int, int]) -> Path:
    """The shipped SR network for a target with token grid (rows, cols)."""
    return WEIGHTS_DIR / f"sr_compact_{grid[0]}x{grid[1]}.safetensors"


def _checked(path: Path) -> Path:
    """A shipped file after comparing its sha256 with the manifest's."""
    entries = json.loads(MANIFEST.read_text())["files"]
    entry = entries.get(path.name)
    if entry is None:
        raise ValueError(f"{path.name} is not in {MANIFEST.name}: none is shipped for this grid; pass "
                         f"decoder draft.upsampler.network=PATH (a spandrel checkpoint)")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != entry["sha256"]:
        raise ValueError(f"{path} has sha256 {digest[:12]}..., the manifest says {entry['sha256'][:12]}...: "
                         "the shipped file is damaged; restore it from the repository")
    return path


def load_sr(path: Path | str, scale: int) -> nn.Module:
    """The SR network in `path`, strictly (module docstring), in eval mode on the CPU."""
    try:
        import spandrel
    except ImportError as exc:
        raise ValueError(f"decoder draft.upsampler.kind=sr reads its network with spandrel, which is not "
                         f"installed: {EXTRA}") from exc
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"decoder draft.upsampler.network={str(path)!r} does not exist: fetch it "
                         "(stages=[fetch]) or give the path of a spandrel checkpoint")
    try:
        descriptor = spandrel.ModelLoader(device="cpu").load_from_file(path)
    except spandrel.UnsupportedModelError as exc:
        raise ValueError(f"{path} is no super-resolution network spandrel recognises ({exc}): give a "
                         "checkpoint of an architecture it supports (ESRGAN, Real-ESRGAN compact, SwinIR, ...)") from exc
    except RuntimeError as exc:  # load_state_dict(strict=True): missing or unexpected keys, wrong shapes
        first = str(exc).strip().splitlines()[0]
        raise ValueError(f"{path} does not load strictly into its detected architecture ({first}): the file is "
                         "incomplete or of another variant") from exc
    if not isinstance(descriptor, spandrel.ImageModelDescriptor):
        raise ValueError(f"{path} holds a {type(descriptor).__name__} (e.g. an inpainting model), not an "
                         "image-to-image network")
    if descriptor.input_channels != 3 or descriptor.output_channels != 3:
        raise ValueError(f"{path} maps {descriptor.input_channels} to {descriptor.output_channels} channels; "
                         "the sr up-sampler needs an RGB-to-RGB network")
    if descriptor.scale != scale:
        raise ValueError(f"{path} is a x{descriptor.scale} network ({descriptor.architecture.name}); these models "
                         f"need x{scale} (the target's grid over the drafter's): give a x{scale} checkpoint")
    log.info("sr up-sampler: %s (%s, x%d)", path, descriptor.architecture.name, descriptor.scale)
    return descriptor.model.eval()


class SRUpsampler:
    """`sr`: decode -> super-resolution network -> encode (module docstring).

    Args:
        network: "realesrgan" (the pinned Real-ESRGAN network of the models' ratio), "shipped" (the
            shapes worlds' trained networks) or a checkpoint path.
    """

    name = "sr"

    def __init__(self, network: str = "shipped") -> None:
        if not network:
            raise ValueError(f"decoder draft.upsampler.network (sr) must be {PINNED!r}, 'shipped' or a checkpoint "
                             f"path, not {network!r}")
        self.network_spec = str(network)
        self._network: nn.Module | None = None

    def _path(self, ctx: Context) -> Path:
        """The checkpoint file for these models (the pinned one fetched or found in the cache)."""
        if self.network_spec == PINNED:
            return fetch(pinned_sr(ratio(ctx.models)))  # verified against its sha256
        if self.network_spec != "shipped":
            return Path(self.network_spec)
        grid = tuple(ctx.models.target.grid)
        path = shipped_sr(grid)
        if not path.is_file():
            raise ValueError(f"no sr network is shipped for a {grid[0]}x{grid[1]} grid ({path.name}); "
                             f"pass decoder draft.upsampler.network={PINNED} or =PATH")
        return _checked(path)

    def network(self, ctx: Context) -> nn.Module:
        """The network on ctx.device, loaded once and checked against the models' ratio."""
        if self._network is None:
            self._network = load_sr(self._path(ctx), ratio(ctx.models))
        return self._network.to(ctx.device)

    @torch.inference_mode()
    def up(self, low: Tensor, ctx: Context) -> Tensor:
        images = ctx.models.drafter.decode(low.flatten(1))  # uint8 [B, 3, h, w]
        high = self.network(ctx)(images.float() / 255)  # [B, 3, r h, r w]
        pixels = (high.clamp(0, 1) * 255).round().to(torch.uint8)
        return ctx.models.target.encode(pixels).view(low.shape[0], *ctx.grid)

    def down(self, high: Tensor, ctx: Context) -> Tensor:
        """The pixel path's down-sampler: decode, bilinear resize by 1 / r, encode."""
        return PixelUpsampler.down(self, high, ctx)  # type: ignore[arg-type]
