"""MuLo-SD's up-samplers U_r (low-res draft tokens -> r x r blocks of high-res tokens) and their
matching down-samplers D_r (committed high-res tokens -> the drafter's low-res prefix), paper.md §4.

Each class pairs `up` and `down`; `r` is the ratio of the target's grid to the drafter's grid.
    nearest  token replication (each low-res token copied to its r x r block); down: the block's
             most frequent token (ties: the first in raster order), so down(up(y)) = y.
    pixel    training-free: tokenizer decode -> resize -> tokenizer encode (the paper's default
             path; an off-the-shelf super-resolution network would replace the resize); down:
             decode -> anti-aliased resize -> encode.
    sr       decode -> a super-resolution network read with spandrel -> encode
             (baselines/methods/sr_upsampler.py: the paper's pixel path with its SR network).
    learned  a trained latent up-sampler (baselines/methods/latent_upsampler.py): masked row-causal
             convolution + pixel shuffle over code vectors; its strided-convolution head is the
             down-sampler. Weights belong to one high-res grid (one world's pixel scale).
Tokens cross models only through `ctx.models` (drafter and target share the tokenizer's codebook).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from baselines.framework.canvas import Context
from baselines.methods.latent_upsampler import LatentUpsampler, load_upsampler
from harness.api import ModelBundle

log = logging.getLogger(__name__)

RESIZE_MODES = ("bicubic", "bilinear", "nearest")
KINDS = ("nearest", "pixel", "learned", "sr")
OBJECTIVES = ("ce", "pixel", "gan")
WEIGHTS_DIR = Path(__file__).parents[1] / "weights"  # shipped: upsampler_<objective>_<rows>x<cols>.safetensors


def shipped_weights(objective: str, grid: tuple[int, int]) -> Path:
    """The shipped learned up-sampler of `objective` for a target with token grid (rows, cols)."""
    return WEIGHTS_DIR / f"upsampler_{objective}_{grid[0]}x{grid[1]}.safetensors"


def _missing_weights(path: str | Path, objective: str, detail: str = "") -> ValueError:
    return ValueError(f"decoder draft.upsampler.weights={str(path)!r} does not exist{detail}: train it with "
                      f"`python -m baselines.training.train_upsampler --objective {objective} --target-size PIXELS "
                      f"--out {path}` or set weights=null for an untrained (smoke-test) module")


class UpSampler(Protocol):
    name: str

    def up(self, low: Tensor, ctx: Context) -> Tensor:
        """low [B, h, w] int64 -> high [B, r*h, r*w] int64."""
        ...

    def down(self, high: Tensor, ctx: Context) -> Tensor:
        """high [B, H, W] int64 -> low [B, H/r, W/r] int64."""
        ...


def ratio(models: ModelBundle) -> int:
    """r = target rows / drafter rows (checked to be an integer, equal on both axes)."""
    (rows, cols), (lr, lc) = tuple(models.target.grid), tuple(models.drafter.grid)
    if rows % lr or cols % lc or rows // lr != cols // lc:
        raise ValueError(f"the drafter's grid {(lr, lc)} must divide the target's {(rows, cols)} by one "
                         "integer ratio r on both axes")
    return rows // lr


def resize_images(images: Tensor, size: tuple[int, int], mode: str) -> Tensor:
    """uint8 [B, 3, H, W] -> uint8 [B, 3, *size]; anti-aliased when shrinking."""
    x = images.float()
    kwargs = {} if mode == "nearest" else {"align_corners": False, "antialias": size[0] < x.shape[-2]}
    out = F.interpolate(x, size=size, mode=mode, **kwargs)
    return out.round().clamp(0, 255).to(torch.uint8)


class NearestUpsampler:
    """`nearest`: token replication (no model involved)."""

    name = "nearest"

    def up(self, low: Tensor, ctx: Context) -> Tensor:
        r = ratio(ctx.models)
        return low.repeat_interleave(r, 1).repeat_interleave(r, 2)

    def down(self, high: Tensor, ctx: Context) -> Tensor:
        r = ratio(ctx.models)
        b, rows, cols = high.shape
        blocks = high.view(b, rows // r, r, cols // r, r).permute(0, 1, 3, 2, 4)
        blocks = blocks.reshape(b, rows // r, cols // r, r * r)
        votes = (blocks[..., :, None] == blocks[..., None, :]).sum(-1)  # [B, h, w, r*r]
        return blocks.gather(-1, votes.argmax(-1, keepdim=True)).squeeze(-1)  # argmax: first maximum


class PixelUpsampler:
    """`pixel`: decode -> resize -> encode, training-free.

    Args:
        mode: resize kernel for up-sampling: "bicubic" (default), "bilinear" or "nearest".
    """

    name = "pixel"

    def __init__(self, mode: str = "bicubic") -> None:
        if mode not in RESIZE_MODES:
            raise ValueError(f"decoder draft.upsampler.mode (pixel) must be one of {RESIZE_MODES}, "
                             f"got {mode!r}")
        self.mode = mode

    def up(self, low: Tensor, ctx: Context) -> Tensor:
        r = ratio(ctx.models)
        images = ctx.models.drafter.decode(low.flatten(1))
        high = resize_images(images, (images.shape[-2] * r, images.shape[-1] * r), self.mode)
        return ctx.models.target.encode(high).view(low.shape[0], *ctx.grid)

    def down(self, high: Tensor, ctx: Context) -> Tensor:
        r = ratio(ctx.models)
        images = ctx.models.target.decode(high.flatten(1))
        low = resize_images(images, (images.shape[-2] // r, images.shape[-1] // r), "bilinear")
        return ctx.models.drafter.encode(low).view(high.shape[0], *ctx.models.drafter.grid)


class LearnedUpsampler:
    """`learned`: a trained LatentUpsampler (baselines/methods/latent_upsampler.py, trained by
    baselines/training/train_upsampler.py).

    Args:
        weights: "shipped" (baselines/weights/upsampler_<objective>_<rows>x<cols>.safetensors for
            the target's token grid: 16x16 for model=shapes, 32x32 for model=shapes_x2), a path
            to a .safetensors file, or null: an untrained module (seeded; smoke tests only).
        objective: the training objective of the shipped weights: ce | pixel | gan.
    """

    name = "learned"

    def __init__(self, weights: str | None = "shipped", objective: str = "gan") -> None:
        if objective not in OBJECTIVES:
            raise ValueError(f"decoder draft.upsampler.objective must be one of {OBJECTIVES}, "
                             f"got {objective!r}")
        if weights not in (None, "shipped") and not Path(weights).is_file():
            raise _missing_weights(weights, objective)
        self.weights = weights
        self.objective = objective
        self._module: LatentUpsampler | None = None

    def module(self, ctx: Context) -> LatentUpsampler:
        """The module on ctx.device (loaded once), checked against the models' codebook."""
        if self._module is None:
            codebook = ctx.models.target.codebook.detach().float().cpu()
            grid = tuple(ctx.models.target.grid)
            if self.weights is None:
                log.warning("learned up-sampler without weights: an untrained module (smoke tests only)")
                self._module = LatentUpsampler(codebook, ratio(ctx.models), grid, seed=0)
            else:
                path = shipped_weights(self.objective, grid) if self.weights == "shipped" else Path(self.weights)
                if not path.is_file():
                    raise _missing_weights(path, self.objective, f" (none is shipped for a {grid[0]}x{grid[1]} grid)")
                self._module = load_upsampler(path)
                self._module.check(codebook, ratio(ctx.models), grid)
            self._module.eval()
        return self._module.to(ctx.device)

    @torch.inference_mode()
    def up(self, low: Tensor, ctx: Context) -> Tensor:
        return self.module(ctx).upsample_tokens(low)

    @torch.inference_mode()
    def down(self, high: Tensor, ctx: Context) -> Tensor:
        return self.module(ctx).downsample_tokens(high)


def build_upsampler(kind: str = "pixel", mode: str = "bicubic", weights: str | None = "shipped",
                    objective: str = "gan", network: str = "shipped") -> UpSampler:
    """The up-/down-sampler pair named `kind` (config entry point; keys a kind does not use are
    ignored, so one config node can be switched with `kind=...`).

    Args:
        kind: "nearest" | "pixel" | "learned" | "sr".
        mode: pixel: the resize kernel (bicubic | bilinear | nearest).
        weights, objective: learned: see LearnedUpsampler.
        network: sr: "realesrgan" (the pinned Real-ESRGAN network of the models' ratio), "shipped"
            (the shapes worlds') or a spandrel checkpoint (baselines/methods/sr_upsampler.py).
    """
    if kind == "nearest":
        return NearestUpsampler()
    if kind == "pixel":
        return PixelUpsampler(mode)
    if kind == "learned":
        return LearnedUpsampler(weights, objective)
    if kind == "sr":
        from baselines.methods.sr_upsampler import SRUpsampler  # it imports this module

        return SRUpsampler(network)
    raise ValueError(f"decoder draft.upsampler.kind must be one of {KINDS}, got {kind!r}")
