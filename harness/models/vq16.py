"""LlamaGen's VQ-16 image tokenizer (`vq_ds16_t2i.pt`), written for this project with the official
state-dict layout (`encoder.conv_blocks.{i}.res.{j}.norm1`, `quantize.embedding`, `quant_conv`,
`post_quant_conv`, `decoder.mid.{k}`, ...) so the released checkpoint loads strictly.

Architecture (LlamaGen `tokenizer/tokenizer_image/vq_model.py`, `VQ_16`): a convolutional encoder
with channel multipliers (1, 1, 2, 2, 4) over base width 128 (4 stride-2 downsamplings: factor
16), two residual blocks per level and self-attention at the lowest level, a mid block
(res, attn, res), GroupNorm(32) everywhere, z_channels 256, a 1x1 `quant_conv` to the 8-dim code
space and a codebook of 16384 codes. Codes and latents are l2-normalised before the nearest-code
lookup, so the lookup is a cosine-similarity argmax. The decoder mirrors the encoder with three
residual blocks per level and nearest-neighbour upsampling followed by a 3x3 conv.

Pixels: uint8 [B, 3, H, W] at the API boundary, [-1, 1] inside (LlamaGen's normalisation).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.models.hub import load_file_into


@dataclass(frozen=True)
class VQConfig:
    """VQ-16 hyper-parameters; the defaults are the official `VQ_16` (72M parameters)."""

    codebook_size: int = 16384
    code_dim: int = 8
    base_channels: int = 128
    channel_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    num_res_blocks: int = 2
    z_channels: int = 256
    norm_groups: int = 32
    l2_norm: bool = True
    usage_buffer: int = 65536  # size of the official `quantize.codebook_used` buffer (0: none)

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.channel_mult) - 1)


def _norm(channels: int, groups: int) -> nn.GroupNorm:
    return nn.GroupNorm(num_groups=groups, num_channels=channels, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    """norm-swish-conv twice, a 1x1 `nin_shortcut` when the width changes.
    [B, Cin, H, W] -> [B, Cout, H, W]."""

    def __init__(self, c_in: int, c_out: int, groups: int) -> None:
        super().__init__()
        self.norm1 = _norm(c_in, groups)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1)
        self.norm2 = _norm(c_out, groups)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1)
        self.nin_shortcut = nn.Conv2d(c_in, c_out, 1) if c_in != c_out else None

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return h + (x if self.nin_shortcut is None else self.nin_shortcut(x))


class AttnBlock(nn.Module):
    """Single-head spatial self-attention with 1x1 q/k/v/proj_out convs. [B, C, H, W] -> same."""

    def __init__(self, channels: int, groups: int) -> None:
        super().__init__()
        self.norm = _norm(channels, groups)
        self.q = nn.Conv2d(channels, channels, 1)
        self.k = nn.Conv2d(channels, channels, 1)
        self.v = nn.Conv2d(channels, channels, 1)
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        b, c, hh, ww = x.shape
        h = self.norm(x)
        q, k, v = (m(h).flatten(2).transpose(1, 2) for m in (self.q, self.k, self.v))  # [B, HW, C]
        out = F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None])[:, 0]
        return x + self.proj_out(out.transpose(1, 2).reshape(b, c, hh, ww))


class Downsample(nn.Module):
    """Pad right/bottom by one, then a stride-2 3x3 conv. [B, C, H, W] -> [B, C, H/2, W/2]."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=0)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample(nn.Module):
    """Nearest x2 then a 3x3 conv. [B, C, H, W] -> [B, C, 2H, 2W]."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


def _level(c_in: int, c_out: int, blocks: int, attn: bool, groups: int) -> nn.Module:
    """One resolution level: `res` (and `attn` at the lowest level) module lists."""
    level = nn.Module()
    level.res = nn.ModuleList(ResnetBlock(c_in if i == 0 else c_out, c_out, groups) for i in range(blocks))
    level.attn = nn.ModuleList(AttnBlock(c_out, groups) for _ in range(blocks if attn else 0))
    return level


def _mid(channels: int, groups: int) -> nn.ModuleList:
    return nn.ModuleList([ResnetBlock(channels, channels, groups), AttnBlock(channels, groups),
                          ResnetBlock(channels, channels, groups)])


def _run_level(level: nn.Module, h: Tensor) -> Tensor:
    for i, res in enumerate(level.res):
        h = res(h)
        if len(level.attn) > 0:
            h = level.attn[i](h)
    return h


class Encoder(nn.Module):
    """[B, 3, H, W] in [-1, 1] -> [B, z_channels, H/16, W/16]."""

    def __init__(self, cfg: VQConfig) -> None:
        super().__init__()
        ch, mult, g = cfg.base_channels, cfg.channel_mult, cfg.norm_groups
        self.conv_in = nn.Conv2d(3, ch, 3, padding=1)
        self.conv_blocks = nn.ModuleList()
        c_in = ch
        for i, m in enumerate(mult):
            last = i == len(mult) - 1
            level = _level(c_in, ch * m, cfg.num_res_blocks, attn=last, groups=g)
            c_in = ch * m
            if not last:
                level.downsample = Downsample(c_in)
            self.conv_blocks.append(level)
        self.mid = _mid(c_in, g)
        self.norm_out = _norm(c_in, g)
        self.conv_out = nn.Conv2d(c_in, cfg.z_channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv_in(x)
        for i, level in enumerate(self.conv_blocks):
            h = _run_level(level, h)
            if i < len(self.conv_blocks) - 1:
                h = level.downsample(h)
        for block in self.mid:
            h = block(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class Decoder(nn.Module):
    """[B, z_channels, h, w] -> [B, 3, 16h, 16w] (float, nominally in [-1, 1])."""

    def __init__(self, cfg: VQConfig) -> None:
        super().__init__()
        ch, mult, g = cfg.base_channels, cfg.channel_mult, cfg.norm_groups
        c_in = ch * mult[-1]
        self.conv_in = nn.Conv2d(cfg.z_channels, c_in, 3, padding=1)
        self.mid = _mid(c_in, g)
        self.conv_blocks = nn.ModuleList()
        for i, m in enumerate(reversed(mult)):
            level = _level(c_in, ch * m, cfg.num_res_blocks + 1, attn=i == 0, groups=g)
            c_in = ch * m
            if i < len(mult) - 1:
                level.upsample = Upsample(c_in)
            self.conv_blocks.append(level)
        self.norm_out = _norm(c_in, g)
        self.conv_out = nn.Conv2d(c_in, 3, 3, padding=1)

    def forward(self, z: Tensor) -> Tensor:
        h = self.conv_in(z)
        for block in self.mid:
            h = block(h)
        for i, level in enumerate(self.conv_blocks):
            h = _run_level(level, h)
            if i < len(self.conv_blocks) - 1:
                h = level.upsample(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class VectorQuantizer(nn.Module):
    """Nearest-code lookup in an (l2-normalised) codebook `embedding` [V, D]."""

    def __init__(self, cfg: VQConfig) -> None:
        super().__init__()
        self.l2_norm = cfg.l2_norm
        self.embedding = nn.Embedding(cfg.codebook_size, cfg.code_dim)
        nn.init.uniform_(self.embedding.weight, -1.0 / cfg.codebook_size, 1.0 / cfg.codebook_size)
        if cfg.usage_buffer:
            # training-time usage statistics; kept only so the official checkpoint loads strictly
            self.register_buffer("codebook_used", torch.zeros(cfg.usage_buffer))

    @property
    def codes(self) -> Tensor:
        """Codebook vectors [V, D] as used for lookup and decoding."""
        w = self.embedding.weight
        return F.normalize(w, p=2, dim=-1) if self.l2_norm else w

    def lookup(self, z: Tensor) -> Tensor:
        """Latents [B, D, h, w] -> indices [B, h, w] of the nearest code (cosine when l2_norm)."""
        flat = z.permute(0, 2, 3, 1).reshape(-1, z.shape[1]).float()
        codes = self.codes.float()
        if self.l2_norm:
            flat = F.normalize(flat, p=2, dim=-1)
        dist = flat.pow(2).sum(1, keepdim=True) + codes.pow(2).sum(1) - 2 * flat @ codes.t()
        return dist.argmin(1).reshape(z.shape[0], z.shape[2], z.shape[3])

    def embed(self, indices: Tensor) -> Tensor:
        """Indices [B, h, w] -> quantised latents [B, D, h, w]."""
        return self.codes[indices].permute(0, 3, 1, 2).contiguous()


class VQModel(nn.Module):
    """The VQ-16 tokenizer: uint8 images <-> token grids (satisfies `image_model.ImageTokenizer`)."""

    def __init__(self, cfg: VQConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg or VQConfig()
        self.encoder = Encoder(self.cfg)
        self.decoder = Decoder(self.cfg)
        self.quantize = VectorQuantizer(self.cfg)
        self.quant_conv = nn.Conv2d(self.cfg.z_channels, self.cfg.code_dim, 1)
        self.post_quant_conv = nn.Conv2d(self.cfg.code_dim, self.cfg.z_channels, 1)

    @property
    def codebook(self) -> Tensor:
        """[V, D] l2-normalised code vectors (float32)."""
        return self.quantize.codes.float()

    @property
    def raw_codebook(self) -> Tensor:
        """[V, D] the stored code vectors before normalisation (float32): LANTERN builds its
        neighbour table from these (entrypoints/generate_codebook.py)."""
        return self.quantize.embedding.weight.float()

    @property
    def _dtype(self) -> torch.dtype:
        return self.quant_conv.weight.dtype

    def encode(self, images: Tensor) -> Tensor:
        """uint8 [B, 3, H, W] (H, W multiples of 16) -> int64 [B, H/16, W/16]."""
        if images.dtype != torch.uint8:
            raise TypeError(f"expected uint8 images, got {images.dtype}")
        f = self.cfg.downsample
        if images.shape[-1] % f or images.shape[-2] % f:
            raise ValueError(f"image size {tuple(images.shape[-2:])} is not a multiple of {f}")
        x = images.to(self.quant_conv.weight.device, self._dtype) / 127.5 - 1.0
        return self.quantize.lookup(self.quant_conv(self.encoder(x)))

    def decode_float(self, tokens: Tensor) -> Tensor:
        """int64 [B, h, w] -> float [B, 3, 16h, 16w] in about [-1, 1]."""
        z = self.quantize.embed(tokens.to(self.quant_conv.weight.device)).to(self._dtype)
        return self.decoder(self.post_quant_conv(z))

    def decode(self, tokens: Tensor) -> Tensor:
        """int64 [B, h, w] -> uint8 [B, 3, 16h, 16w]."""
        x = self.decode_float(tokens).float().clamp(-1.0, 1.0)
        return ((x + 1.0) * 127.5).round().to(torch.uint8)


def vq_config(vq: dict[str, Any] | None) -> VQConfig:
    v = dict(vq or {})
    if "channel_mult" in v:
        v["channel_mult"] = tuple(v["channel_mult"])
    return VQConfig(**v)


def load_vq(cfg: VQConfig, path: Path | None, dtype: torch.dtype, trust_pickle: bool, seed: int) -> VQModel:
    """The VQ-16 tokenizer from `path` (strict), or seeded random weights when `path` is None."""
    torch.manual_seed(seed)
    vq = VQModel(cfg)
    if path is not None:
        load_file_into(vq, path, "VQ-16 tokenizer", trust_pickle)
    return vq.eval().to(dtype)
