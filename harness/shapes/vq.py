"""ShapesVQ: the small convolutional VQ-VAE tokenizer of the "shapes" world.

Two stride-2 downsamplings (factor 4), so one set of weights tokenizes 64x64 renders into 16x16
tokens (target model) and 32x32 renders into 8x8 tokens (half-resolution drafter). Codes and
latents are l2-normalised before the nearest-neighbour lookup (as in LlamaGen's VQ), i.e. the
lookup is a cosine-similarity argmax; gradients pass the quantizer with the straight-through
estimator. There are no normalisation layers, so a token depends only on its receptive field and
not on statistics of the rest of the image.

Pixel convention: images are uint8 [B, 3, H, W] at the API boundary and float in [-1, 1] inside.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from harness.runtime import hostsync

DOWNSAMPLE = 4
COMMIT_BETA = 0.25


def to_float(images: Tensor) -> Tensor:
    """uint8 [B, 3, H, W] in [0, 255] -> float32 [B, 3, H, W] in [-1, 1]."""
    if images.dtype != torch.uint8:
        raise TypeError(f"expected uint8 images, got {images.dtype}")
    return images.float() / 127.5 - 1.0


def to_uint8(images: Tensor) -> Tensor:
    """float [B, 3, H, W] in [-1, 1] (values outside are clipped) -> uint8 [B, 3, H, W]."""
    return ((images.float().clamp(-1.0, 1.0) + 1.0) * 127.5).round().to(torch.uint8)


class ResBlock(nn.Module):
    """x + conv(silu(conv(silu(x)))) at constant width; the second conv starts at zero so that
    each block is the identity at initialisation (stable without normalisation layers)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        nn.init.zeros_(self.conv2.weight)
        nn.init.zeros_(self.conv2.bias)

    def forward(self, x: Tensor) -> Tensor:
        """[B, C, H, W] -> [B, C, H, W]."""
        return x + self.conv2(F.silu(self.conv1(F.silu(x))))


class Encoder(nn.Module):
    """[B, 3, H, W] -> [B, code_dim, H/4, W/4] (unnormalised latents)."""

    def __init__(self, channels: tuple[int, int, int], res_blocks: int, code_dim: int) -> None:
        super().__init__()
        c0, c1, c2 = channels
        layers: list[nn.Module] = [nn.Conv2d(3, c0, 3, padding=1)]
        layers += [ResBlock(c0) for _ in range(res_blocks)]
        layers += [nn.Conv2d(c0, c1, 3, stride=2, padding=1)]
        layers += [ResBlock(c1) for _ in range(res_blocks)]
        layers += [nn.Conv2d(c1, c2, 3, stride=2, padding=1)]
        layers += [ResBlock(c2) for _ in range(res_blocks + 1)]
        layers += [nn.SiLU(), nn.Conv2d(c2, code_dim, 1)]
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def activations(self, x: Tensor) -> list[Tensor]:
        """The output of every layer (a perceptual-loss feature stack); the last is forward(x)."""
        out = []
        for layer in self.net:
            x = layer(x)
            out.append(x)
        return out


class PatchEncoder(nn.Module):
    """[B, 3, H, W] -> [B, code_dim, H/4, W/4]: each latent is a function of its own 4x4 pixel
    patch only (a stride-4 patch projection, then per-token residual MLP layers as 1x1 convs).
    A token therefore never depends on its neighbours or on the image border: a flat background
    patch has one code wherever it lies, which keeps the token sequences the GPTs model simple."""

    def __init__(self, width: int, blocks: int, code_dim: int) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, width, DOWNSAMPLE, stride=DOWNSAMPLE)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.SiLU(), nn.Conv2d(width, width, 1), nn.SiLU(), nn.Conv2d(width, width, 1))
            for _ in range(blocks))
        self.out = nn.Sequential(nn.SiLU(), nn.Conv2d(width, code_dim, 1))

    def forward(self, x: Tensor) -> Tensor:
        return self.activations(x)[-1]

    def activations(self, x: Tensor) -> list[Tensor]:
        """The patch projection, every residual block and the latents (the last entry)."""
        out = [self.patch(x)]
        for block in self.blocks:
            out.append(out[-1] + block(out[-1]))
        out.append(self.out(out[-1]))
        return out


class Decoder(nn.Module):
    """[B, code_dim, h, w] -> [B, 3, 4h, 4w] (float, ideally in [-1, 1])."""

    def __init__(self, channels: tuple[int, int, int], res_blocks: int, code_dim: int) -> None:
        super().__init__()
        c0, c1, c2 = channels
        layers: list[nn.Module] = [nn.Conv2d(code_dim, c2, 3, padding=1)]
        layers += [ResBlock(c2) for _ in range(res_blocks + 1)]
        layers += [nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(c2, c1, 3, padding=1)]
        layers += [ResBlock(c1) for _ in range(res_blocks)]
        layers += [nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(c1, c0, 3, padding=1)]
        layers += [ResBlock(c0) for _ in range(res_blocks)]
        layers += [nn.SiLU(), nn.Conv2d(c0, 3, 3, padding=1)]
        self.net = nn.Sequential(*layers)

    def forward(self, z: Tensor) -> Tensor:
        return self.net(z)


class ShapesVQ(nn.Module):
    """Convolutional VQ-VAE, downsampling factor 4, `codebook_size` l2-normalised codes of
    dimension `code_dim`.

    `channels` are the widths at full, half and quarter resolution; `res_blocks` residual blocks
    per resolution (one more at the quarter-resolution bottleneck). `encoder="conv"` is the
    mirror of the decoder (a receptive field of ~50 px); `encoder="patch"` (the shipped
    tokenizer) sees only each token's own 4x4 patch (`PatchEncoder`, width `channels[2]`).
    """

    def __init__(
        self,
        *,
        codebook_size: int = 512,
        code_dim: int = 8,
        channels: tuple[int, int, int] = (32, 64, 96),
        res_blocks: int = 1,
        encoder: str = "conv",
    ) -> None:
        super().__init__()
        if len(channels) != 3:
            raise ValueError(f"channels must give 3 widths (full, 1/2, 1/4 res), got {channels}")
        if encoder not in ("conv", "patch"):
            raise ValueError(f"encoder must be 'conv' or 'patch', got {encoder!r}")
        self.codebook_size = codebook_size
        self.code_dim = code_dim
        self.config = {"codebook_size": codebook_size, "code_dim": code_dim,
                       "channels": list(channels), "res_blocks": res_blocks, "encoder": encoder}
        self.encoder: nn.Module = (Encoder(tuple(channels), res_blocks, code_dim) if encoder == "conv"
                                   else PatchEncoder(channels[2], res_blocks + 1, code_dim))
        self.decoder = Decoder(tuple(channels), res_blocks, code_dim)
        self.embedding = nn.Embedding(codebook_size, code_dim)
        nn.init.normal_(self.embedding.weight)
        # Codes the encoder may emit. All while training; after it, `restrict` keeps the codes that
        # real renders use, so an off-manifold image (e.g. a decoded 32 px image resized to 64 px)
        # is encoded with codes the GPTs were trained on instead of never-seen ones.
        self.register_buffer("active", torch.ones(codebook_size, dtype=torch.bool))

    def restrict(self, active: Tensor) -> None:
        """Let the encoder emit only the codes flagged in active [V] bool (decode is unchanged)."""
        if active.shape != (self.codebook_size,) or active.dtype != torch.bool or not bool(active.any()):
            raise ValueError(f"active must be a non-empty bool mask of {self.codebook_size} codes")
        self.active.copy_(active)

    @property
    def codebook(self) -> Tensor:
        """The l2-normalised code vectors [V, D] (what latents are matched against)."""
        return F.normalize(self.embedding.weight, dim=1)

    @property
    def raw_codebook(self) -> Tensor:
        """The stored code vectors [V, D] before normalisation (LANTERN's neighbour metric)."""
        return self.embedding.weight

    def _check_size(self, height: int, width: int) -> None:
        if height % DOWNSAMPLE or width % DOWNSAMPLE:
            raise ValueError(f"image size {height}x{width} is not divisible by {DOWNSAMPLE}")

    def quantize(self, z: Tensor) -> tuple[Tensor, dict[str, Tensor], Tensor]:
        """Nearest code by cosine similarity, in fp32 even under autocast.

        z [B, D, h, w] -> (z_q [B, D, h, w] normalised codes with a straight-through gradient to z,
        {"codebook", "commit"} losses (scalars), indices [B, h, w] int64).
        """
        with torch.autocast(z.device.type, enabled=False):
            z_n = F.normalize(z.float(), dim=1)
            codes = self.codebook
            flat = z_n.permute(0, 2, 3, 1).reshape(-1, self.code_dim)  # [B*h*w, D]
            scores = (flat @ codes.t()).masked_fill(~self.active, -2.0)  # cosine >= -1 > -2
            indices = scores.argmax(dim=1)
            z_q = codes[indices].view(z.shape[0], z.shape[2], z.shape[3], self.code_dim)
            z_q = z_q.permute(0, 3, 1, 2)
            losses = {
                "codebook": F.mse_loss(z_q, z_n.detach()),
                "commit": COMMIT_BETA * F.mse_loss(z_n, z_q.detach()),
            }
            z_st = z_n + (z_q - z_n).detach()
        return z_st, losses, indices.view(z.shape[0], z.shape[2], z.shape[3])

    def forward(self, x: Tensor) -> tuple[Tensor, dict[str, Tensor], Tensor]:
        """x float [B, 3, H, W] in [-1, 1] -> (reconstruction float [B, 3, H, W],
        {"codebook", "commit"} losses, indices [B, H/4, W/4] int64)."""
        self._check_size(x.shape[2], x.shape[3])
        z_q, losses, indices = self.quantize(self.encoder(x))
        return self.decoder(z_q), losses, indices

    @torch.no_grad()
    def encode(self, images: Tensor) -> Tensor:
        """uint8 [B, 3, H, W] -> token indices int64 [B, H/4, W/4] (fp32, no autocast)."""
        self._check_size(images.shape[2], images.shape[3])
        with torch.autocast(images.device.type, enabled=False):
            _, _, indices = self.quantize(self.encoder(to_float(images)))
        return indices

    def decode_codes(self, z: Tensor) -> Tensor:
        """Code vectors float [B, D, h, w] -> images float [B, 3, 4h, 4w], nominally in [-1, 1]
        (not clipped)."""
        if z.dim() != 4 or z.shape[1] != self.code_dim:
            raise ValueError(f"expected codes [B, {self.code_dim}, h, w], got {tuple(z.shape)}")
        return self.decoder(z)

    @torch.no_grad()
    def decode(self, tokens: Tensor) -> Tensor:
        """Token indices int [B, h, w] -> uint8 images [B, 3, 4h, 4w] (fp32, no autocast)."""
        if tokens.dim() != 3:
            raise ValueError(f"expected tokens [B, h, w], got {tuple(tokens.shape)}")
        # checked where reading is free; on a GPU an id out of range fails in the indexing itself
        if tokens.numel() and hostsync.reads_are_free(tokens.device) and (
                int(tokens.min()) < 0 or int(tokens.max()) >= self.codebook_size):
            raise ValueError(f"token ids must lie in [0, {self.codebook_size})")
        z = self.codebook[tokens.long()].permute(0, 3, 1, 2)
        with torch.autocast(tokens.device.type, enabled=False):
            return to_uint8(self.decode_codes(z))


def model_config(model: ShapesVQ) -> dict[str, Any]:
    """The constructor kwargs that rebuild `model` (stored next to its weights)."""
    return dict(model.config)


def save_tokenizer(model: ShapesVQ, path: Path) -> None:
    """Write the model state (weights only) to a safetensors file, kwargs in its metadata;
    written to a temporary file first and then renamed, so `path` is never half-written."""
    path = Path(path)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    tmp = path.with_name(path.name + ".tmp")
    save_file(state, str(tmp), metadata={"config": json.dumps(model_config(model))})
    os.chmod(tmp, 0o644)  # safetensors creates the file owner-only
    os.replace(tmp, path)


def load_tokenizer(path: Path, map_location: str = "cpu") -> ShapesVQ:
    """Rebuild a ShapesVQ from `save_tokenizer`'s file; strict: every tensor must match."""
    path = Path(path)
    with safe_open(str(path), framework="pt", device=map_location) as f:
        meta = f.metadata() or {}
        if "config" not in meta:
            raise ValueError(f"{path} has no 'config' metadata; not written by save_tokenizer")
        state = {k: f.get_tensor(k) for k in f.keys()}
    config = json.loads(meta["config"])
    config["channels"] = tuple(config["channels"])
    model = ShapesVQ(**config)
    model.load_state_dict(state, strict=True)
    return model.eval()
