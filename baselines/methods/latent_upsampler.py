"""The learned latent up-sampler of MuLo-SD (paper.md §4, v1's main design): a masked row-causal
convolution stack + pixel shuffle over the code vectors of the low-res tokens, predicting r x r
high-res code vectors per low-res position; and the matching strided-convolution down-sampler.

Row-causal: output row i sees input rows <= i only (kernel rows below the centre are masked), so
the high-res rows of a drafted low-res row never depend on rows not drafted yet. Tokens come from
cosine similarity to the (frozen, l2-normalised) codebook, scaled by a learned temperature, which
serves both the token cross-entropy objective and the pixel objectives (decode the predicted code
vectors with the frozen VQ decoder), see baselines/training/train_upsampler.py.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor, nn


class RowCausalConv2d(nn.Conv2d):
    """A k x k convolution (k odd, 'same' padding) whose kernel rows below the centre are zero."""

    def __init__(self, cin: int, cout: int, kernel: int = 3) -> None:
        if kernel % 2 == 0:
            raise ValueError(f"row-causal kernel size must be odd, got {kernel}")
        super().__init__(cin, cout, kernel, padding=kernel // 2)
        mask = torch.ones(kernel, kernel)
        mask[kernel // 2 + 1:] = 0.0
        self.register_buffer("row_mask", mask, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        """[B, Cin, h, w] -> [B, Cout, h, w]."""
        return F.conv2d(x, self.weight * self.row_mask, self.bias, padding=self.padding)


class LatentUpsampler(nn.Module):
    """Low-res tokens [B, h, w] -> high-res code vectors [B, D, r*h, r*w] -> tokens; and back.

    Args:
        codebook: [V, D] the tokenizer's code vectors (copied, frozen, l2-normalised).
        r: up-sampling ratio.
        grid: the high-res token grid (rows, cols) it is trained for. Weights are tied to a world's
            pixel scale, not only to r: an edge the drafter draws at 32 px and the target at 64 px
            looks unlike one drawn at 64 and 128 px, so `check` refuses another grid.
        active: [V] bool, the codes the tokenizer's encoder may emit (None: all); tokens are chosen
            among these only, as the encoder would choose them.
        width, depth, kernel: hidden channels, residual row-causal blocks, kernel size.
        seed: initialisation seed (the module never touches the global RNG).
    """

    def __init__(self, codebook: Tensor, r: int, grid: tuple[int, int], width: int = 64, depth: int = 3,
                 kernel: int = 3, seed: int = 0, active: Tensor | None = None) -> None:
        super().__init__()
        v, d = codebook.shape
        rows, cols = (int(g) for g in grid)
        if rows % r or cols % r:
            raise ValueError(f"the high-res grid {(rows, cols)} must be divisible by r = {r}")
        self.config = {"vocab": v, "code_dim": d, "r": r, "grid": [rows, cols], "width": width, "depth": depth,
                       "kernel": kernel}
        self.register_buffer("codebook", F.normalize(codebook.detach().float(), dim=1))
        mask = torch.ones(v, dtype=torch.bool) if active is None else active.detach().to("cpu", torch.bool)
        if mask.shape != (v,) or not bool(mask.any()):
            raise ValueError(f"active must be a non-empty bool mask of the {v} codes")
        self.register_buffer("active", mask.clone())
        self.stem = RowCausalConv2d(d, width, kernel)
        self.blocks = nn.ModuleList(RowCausalConv2d(width, width, kernel) for _ in range(depth))
        self.to_sub = RowCausalConv2d(width, d * r * r, 1)  # r*r sub-positions per low-res position
        self.down_net = nn.Sequential(nn.Conv2d(d, width, r, stride=r), nn.SiLU(), nn.Conv2d(width, d, 1))
        # logits = e^s * cosine similarity. Neighbouring codes of an 8-d codebook have cosines within a
        # few hundredths, so the scale must reach ~100 for a sharp choice; from e^2.5 ~ 12 the token
        # cross-entropy stayed at 4.4 nats after 600 steps.
        self.log_scale = nn.Parameter(torch.tensor(4.6))
        self._reset(seed)

    def _reset(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        for p in self.parameters():
            if p.dim() > 1:
                fan_in = p[0].numel()
                p.data.copy_(torch.randn(p.shape, generator=g) / fan_in**0.5)
            elif p is not self.log_scale:
                p.data.zero_()

    @property
    def r(self) -> int:
        return int(self.config["r"])

    @property
    def grid(self) -> tuple[int, int]:
        rows, cols = self.config["grid"]
        return int(rows), int(cols)

    def embed(self, tokens: Tensor) -> Tensor:
        """tokens [B, h, w] -> code vectors [B, D, h, w]."""
        return self.codebook[tokens].permute(0, 3, 1, 2)

    def up_latents(self, low: Tensor) -> Tensor:
        """low tokens [B, h, w] -> predicted high-res code vectors [B, D, r*h, r*w] (unnormalised)."""
        h = F.silu(self.stem(self.embed(low)))
        for block in self.blocks:
            h = h + block(F.silu(h))
        return F.pixel_shuffle(self.to_sub(F.silu(h)), self.r)

    def logits(self, latents: Tensor) -> Tensor:
        """code vectors [B, D, H, W] -> logits [B, V, H, W] (scaled cosine similarity)."""
        z = F.normalize(latents, dim=1)
        logits = self.log_scale.exp() * torch.einsum("bdhw,vd->bvhw", z, self.codebook)
        return logits.masked_fill(~self.active[:, None, None], -1e4)  # codes the encoder never emits

    def down_latents(self, high: Tensor) -> Tensor:
        """high tokens [B, H, W] -> low-res code vectors [B, D, H/r, W/r]."""
        return self.down_net(self.embed(high))

    def upsample_tokens(self, low: Tensor) -> Tensor:
        """low [B, h, w] -> high [B, r*h, r*w] int64 (the nearest code of each prediction)."""
        return self.logits(self.up_latents(low)).argmax(1)

    def downsample_tokens(self, high: Tensor) -> Tensor:
        """high [B, H, W] -> low [B, H/r, W/r] int64."""
        return self.logits(self.down_latents(high)).argmax(1)

    def check(self, codebook: Tensor, r: int, grid: tuple[int, int]) -> None:
        """Refuse weights trained for another tokenizer, ratio or high-res grid [rows, cols]."""
        if tuple(codebook.shape) != tuple(self.codebook.shape) or r != self.r:
            raise ValueError(f"learned up-sampler was trained for codebook {tuple(self.codebook.shape)} and "
                             f"r = {self.r}; these models have {tuple(codebook.shape)} and r = {r}")
        if tuple(int(g) for g in grid) != self.grid:
            raise ValueError(f"learned up-sampler was trained for a {self.grid[0]}x{self.grid[1]} high-res grid; "
                             f"this target's grid is {grid[0]}x{grid[1]}: train one at that grid "
                             "(python -m baselines.training.train_upsampler --target-size PIXELS)")
        if not torch.allclose(F.normalize(codebook.float(), dim=1), self.codebook.cpu(), atol=1e-5):
            raise ValueError("learned up-sampler was trained for another tokenizer (its codebook differs)")


def save_upsampler(module: LatentUpsampler, path: Path, extra: dict[str, object] | None = None) -> None:
    """Weights to a safetensors file (config and training `extra` in its metadata), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    tmp = path.with_name(path.name + ".tmp")
    meta = {"config": json.dumps(module.config), "extra": json.dumps(extra or {})}
    save_file(state, str(tmp), metadata=meta)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def load_upsampler(path: str | Path) -> LatentUpsampler:
    """Rebuild a LatentUpsampler from `save_upsampler`'s file (strict)."""
    with safe_open(str(path), framework="pt", device="cpu") as f:
        config = json.loads((f.metadata() or {}).get("config", "{}"))
        state = {k: f.get_tensor(k) for k in f.keys()}
    missing = {"r", "grid", "width", "depth", "kernel"} - set(config)
    if missing:
        raise ValueError(f"{path} is not a learned up-sampler file of this version (its config lacks "
                         f"{sorted(missing)}): retrain it with python -m baselines.training.train_upsampler")
    module = LatentUpsampler(state["codebook"], config["r"], tuple(config["grid"]), width=config["width"],
                             depth=config["depth"], kernel=config["kernel"], active=state.get("active"))
    module.load_state_dict(state, strict=True)
    return module
