"""Chameleon's image tokenizer: a taming-transformers VQGAN (8192 codes of width 256, downsampling
16), encoder and decoder, read from Meta's Chameleon release (`tokenizer/vqgan.ckpt` with its
`tokenizer/vqgan.yaml`), as Lumina-mGPT decodes its images (commit 104abe4:
`lumina_mgpt/model/chameleon_vae_ori/{vqgan.py,image_tokenizer.py}`; transformers' Chameleon has
the encoder only).

Key names are the checkpoint's (`encoder.conv_in`, `encoder.down.{i}.block.{j}.{norm1,conv1,norm2,
conv2,nin_shortcut}`, `encoder.down.{i}.attn.{j}.{norm,q,k,v,proj_out}`, `encoder.down.{i}.downsample.
conv`, `encoder.mid.{block_1,attn_1,block_2}`, `encoder.norm_out`, `encoder.conv_out`, the mirrored
`decoder.up.{i}.{block,attn,upsample}`, `quantize.embedding`, `quant_conv`, `post_quant_conv`).
The checkpoint also stores the GAN training loss (`loss.*`: discriminator, LPIPS); those keys are
dropped by name and everything else loads strictly.

Pixels: uint8 <-> [-1, 1] as the official `img_tokens_from_pil` / `_pil_from_chw_tensor` (decoded
values are clamped, mapped to [0, 1] and truncated to uint8 after * 255).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.models.hub import WeightsError, load_strict, read_checkpoint, state_dict_of

LOSS_PREFIX = "loss."  # training-only modules stored in vqgan.ckpt


@dataclass(frozen=True, slots=True, kw_only=True)
class VQGANConfig:
    """`model.params` of vqgan.yaml (defaults: Chameleon's)."""

    n_embed: int = 8192
    embed_dim: int = 256
    z_channels: int = 256
    ch: int = 128
    ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    num_res_blocks: int = 2
    attn_resolutions: tuple[int, ...] = ()
    resolution: int = 512
    in_channels: int = 3
    out_ch: int = 3

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)

    @classmethod
    def from_yaml(cls, params: Mapping[str, Any], where: str) -> "VQGANConfig":
        """From vqgan.yaml's `model.params` (ddconfig inside); options not implemented are refused."""
        dd = dict(params.get("ddconfig") or {})
        if dd.get("double_z", False) or params.get("remap") is not None:
            raise WeightsError(f"{where}: double_z / remap VQGANs are not supported")
        keys = ("z_channels", "ch", "num_res_blocks", "resolution", "in_channels", "out_ch")
        return cls(n_embed=int(params["n_embed"]), embed_dim=int(params["embed_dim"]),
                   ch_mult=tuple(dd.get("ch_mult", cls.ch_mult)),
                   attn_resolutions=tuple(dd.get("attn_resolutions") or ()),
                   **{k: dd[k] for k in keys if k in dd})


def group_norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(32, channels, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    """norm-swish-conv twice, plus a 1x1 `nin_shortcut` when the width changes."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.norm1, self.conv1 = group_norm(cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2, self.conv2 = group_norm(cout), nn.Conv2d(cout, cout, 3, padding=1)
        if cin != cout:
            self.nin_shortcut = nn.Conv2d(cin, cout, 1)

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return (self.nin_shortcut(x) if hasattr(self, "nin_shortcut") else x) + h


class AttnBlock(nn.Module):
    """Single-head self-attention over the pixels with 1x1 convolutions."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.norm = group_norm(c)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(c, c, 1) for _ in range(4))

    def forward(self, x: Tensor) -> Tensor:
        b, c, h, w = x.shape
        y = self.norm(x)
        q, k, v = (f(y).reshape(b, 1, c, h * w).transpose(2, 3) for f in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v)  # scale c^-1/2
        return x + self.proj_out(out.transpose(2, 3).reshape(b, c, h, w))


class Downsample(nn.Module):
    """Pad right/bottom by one, then a stride-2 3x3 convolution."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, stride=2)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample(nn.Module):
    """Nearest x2, then a 3x3 convolution."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


def _level(blocks: int, cin: int, cout: int, attn: bool) -> tuple[nn.Module, int]:
    level = nn.Module()
    level.block = nn.ModuleList(ResnetBlock(cin if i == 0 else cout, cout) for i in range(blocks))
    level.attn = nn.ModuleList(AttnBlock(cout) for _ in range(blocks if attn else 0))
    return level, cout


def _mid(c: int) -> nn.Module:
    mid = nn.Module()
    mid.block_1, mid.attn_1, mid.block_2 = ResnetBlock(c, c), AttnBlock(c), ResnetBlock(c, c)
    return mid


def _run_level(level: nn.Module, h: Tensor) -> Tensor:
    for i, block in enumerate(level.block):
        h = block(h)
        if len(level.attn):
            h = level.attn[i](h)
    return h


class Encoder(nn.Module):
    def __init__(self, cfg: VQGANConfig) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(cfg.in_channels, cfg.ch, 3, padding=1)
        self.down = nn.ModuleList()
        res, cin = cfg.resolution, cfg.ch
        for i, mult in enumerate(cfg.ch_mult):
            level, cin = _level(cfg.num_res_blocks, cin, cfg.ch * mult, res in cfg.attn_resolutions)
            if i != len(cfg.ch_mult) - 1:
                level.downsample = Downsample(cin)
                res //= 2
            self.down.append(level)
        self.mid = _mid(cin)
        self.norm_out = group_norm(cin)
        self.conv_out = nn.Conv2d(cin, cfg.z_channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        """x [B, 3, H, W] in [-1, 1] -> z [B, z_channels, H/16, W/16]."""
        h = self.conv_in(x)
        for level in self.down:
            h = _run_level(level, h)
            if hasattr(level, "downsample"):
                h = level.downsample(h)
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h)))
        return self.conv_out(F.silu(self.norm_out(h)))


class Decoder(nn.Module):
    def __init__(self, cfg: VQGANConfig) -> None:
        super().__init__()
        cin = cfg.ch * cfg.ch_mult[-1]
        res = cfg.resolution // cfg.downsample
        self.conv_in = nn.Conv2d(cfg.z_channels, cin, 3, padding=1)
        self.mid = _mid(cin)
        levels: list[nn.Module] = []
        for i in reversed(range(len(cfg.ch_mult))):
            level, cin = _level(cfg.num_res_blocks + 1, cin, cfg.ch * cfg.ch_mult[i], res in cfg.attn_resolutions)
            if i != 0:
                level.upsample = Upsample(cin)
                res *= 2
            levels.insert(0, level)
        self.up = nn.ModuleList(levels)  # up[0] is the finest level, run last
        self.norm_out = group_norm(cin)
        self.conv_out = nn.Conv2d(cin, cfg.out_ch, 3, padding=1)

    def forward(self, z: Tensor) -> Tensor:
        """z [B, z_channels, h, w] -> x [B, 3, 16h, 16w] (unclamped)."""
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(self.conv_in(z))))
        for level in reversed(self.up):
            h = _run_level(level, h)
            if hasattr(level, "upsample"):
                h = level.upsample(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class Quantizer(nn.Module):
    def __init__(self, cfg: VQGANConfig) -> None:
        super().__init__()
        self.embedding = nn.Embedding(cfg.n_embed, cfg.embed_dim)


class VQGAN(nn.Module):
    """Chameleon's VQGAN: codes [B, h, w] <-> uint8 images [B, 3, 16h, 16w]."""

    def __init__(self, cfg: VQGANConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder, self.decoder = Encoder(cfg), Decoder(cfg)
        self.quantize = Quantizer(cfg)
        self.quant_conv = nn.Conv2d(cfg.z_channels, cfg.embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(cfg.embed_dim, cfg.z_channels, 1)

    @property
    def codebook(self) -> Tensor:
        """[n_embed, embed_dim] code vectors."""
        return self.quantize.embedding.weight

    @torch.inference_mode()
    def decode(self, codes: Tensor) -> Tensor:
        """codes [B, h, w] int64 -> images [B, 3, 16h, 16w] uint8."""
        w = self.post_quant_conv.weight
        z = self.quantize.embedding(codes.to(w.device)).permute(0, 3, 1, 2).to(w.dtype)
        x = self.decoder(self.post_quant_conv(z)).float()
        return ((x.clamp(-1, 1) + 1) / 2 * 255).to(torch.uint8)  # truncation, as the official uint8 cast

    @torch.inference_mode()
    def encode(self, images: Tensor) -> Tensor:
        """images [B, 3, H, W] uint8 -> codes [B, H/16, W/16] (nearest code in L2)."""
        w = self.quant_conv.weight
        x = images.to(w.device, torch.float32) / 255 * 2 - 1
        z = self.quant_conv(self.encoder(x.to(w.dtype))).float().permute(0, 2, 3, 1)  # [B, h, w, D]
        book = self.codebook.float()
        dist = z.pow(2).sum(-1, keepdim=True) + book.pow(2).sum(-1) - 2 * z @ book.T
        return dist.argmin(-1)


def read_yaml(path: Path) -> VQGANConfig:
    import yaml

    try:
        params = yaml.safe_load(path.read_text())["model"]["params"]
    except (OSError, KeyError, TypeError, yaml.YAMLError) as err:
        raise WeightsError(f"cannot read the VQGAN config {path} (expected Chameleon's vqgan.yaml with "
                           f"model.params): {err}") from err
    return VQGANConfig.from_yaml(params, str(path))


def load_vqgan(ckpt: Path, config: Path, dtype: torch.dtype, trust_pickle: bool) -> VQGAN:
    """The VQGAN of `ckpt` ({'state_dict': ...}) built from `config`, loaded strictly after dropping
    the training-loss keys."""
    vq = VQGAN(read_yaml(config))
    state = state_dict_of(read_checkpoint(ckpt, trust_pickle), ckpt, ("state_dict",))
    state = {k: v for k, v in state.items() if not k.startswith(LOSS_PREFIX)}
    load_strict(vq, state, ckpt, "Chameleon VQGAN")
    return vq.eval().to(dtype)
