"""Seeded training of MuLo-SD's learned latent up-sampler (baselines/methods/latent_upsampler.py) on the
shapes world, with each of the paper's objectives (paper.md §4, ablation a):

    ce     token cross-entropy of the predicted high-res codes against the tokenizer's tokens of
           the same scene rendered at the target's resolution;
    pixel  pixel reconstruction: the predicted codes go through the frozen VQ decoder, loss = MSE
           + a perceptual term + a commitment term to the target codes (S7). The perceptual term
           is a feature-matching loss on the frozen VQ encoder's activations (LPIPS needs VGG
           weights, which the shapes world does not ship);
    gan    pixel + a small PatchGAN discriminator (hinge loss), switched on after a warm-up.
Every objective also trains the down-sampler head with cross-entropy against the tokens of the
scene rendered at the drafter's resolution. Data: freshly sampled scenes, batch s of seed S is a
pure function of (S, s); the module's and the discriminator's initialisations are seeded.

Weights are trained for one world's pixel scale (`--target-size`, the target's image size: 64 px
on the x1 shapes world, 128 on x2) and record their high-res grid; the shipped ones are
baselines/weights/upsampler_<objective>_<rows>x<cols>.safetensors:

    python -m baselines.training.train_upsampler --objective gan --steps 600 \
        --out baselines/weights/upsampler_gan_16x16.safetensors
    python -m baselines.training.train_upsampler --objective gan --steps 1200 --target-size 128 \
        --device cuda --out baselines/weights/upsampler_gan_32x32.safetensors
"""
from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from baselines.methods.latent_upsampler import LatentUpsampler, save_upsampler
from harness.shapes import scenes
from harness.shapes.vq import DOWNSAMPLE, ShapesVQ, load_tokenizer, to_float

log = logging.getLogger(__name__)

OBJECTIVES = ("ce", "pixel", "gan")
EVAL_SEED = 12345


def scene_pairs(seed: int, step: int, n: int, size: int, r: int) -> tuple[Tensor, Tensor]:
    """The same n random scenes at `size` and `size // r` px -> (uint8 [n, 3, size, size],
    uint8 [n, 3, size/r, size/r]); a pure function of (seed, step)."""
    rng = np.random.default_rng([seed, step])
    chosen = [scenes.sample_scene(rng) for _ in range(n)]

    def rendered(px: int) -> Tensor:
        images = np.stack([scenes.render(c, px) for c in chosen])  # [n, px, px, 3]
        return torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()

    return rendered(size), rendered(size // r)


class PatchDiscriminator(nn.Module):
    """A small PatchGAN: images [B, 3, H, W] in [-1, 1] -> patch logits [B, 1, H/8, W/8]."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, width, 4, 2, 1), nn.LeakyReLU(0.2),
            nn.Conv2d(width, 2 * width, 4, 2, 1), nn.LeakyReLU(0.2),
            nn.Conv2d(2 * width, 2 * width, 4, 2, 1), nn.LeakyReLU(0.2),
            nn.Conv2d(2 * width, 1, 3, 1, 1))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


def perceptual(vq: ShapesVQ, recon: Tensor, target: Tensor) -> Tensor:
    """Mean L1 distance between the frozen VQ encoder's activations of recon and target
    ([B, 3, H, W] in [-1, 1]), over every layer of the encoder."""
    ours, theirs = vq.encoder.activations(recon), vq.encoder.activations(target)
    return sum((a - b.detach()).abs().mean() for a, b in zip(ours, theirs, strict=True)) / len(ours)


def up_loss(module: LatentUpsampler, vq: ShapesVQ, objective: str, low: Tensor, high: Tensor,
            image: Tensor, weights: dict[str, float]) -> tuple[Tensor, dict[str, float], Tensor | None]:
    """The up-sampler's loss for one batch: low [B, h, w] / high [B, H, W] tokens, image float
    [B, 3, 4H, 4W]. Returns (loss, logged terms, the reconstruction for the GAN or None)."""
    latents = module.up_latents(low)
    if objective == "ce":
        loss = F.cross_entropy(module.logits(latents), high)
        return loss, {"ce": loss.item()}, None
    codes = F.normalize(latents, dim=1)
    recon = vq.decode_codes(codes)
    mse = F.mse_loss(recon, image)
    perc = perceptual(vq, recon, image)
    commit = F.mse_loss(codes, module.embed(high))
    loss = mse + weights["perceptual"] * perc + weights["commit"] * commit
    return loss, {"mse": mse.item(), "perceptual": perc.item(), "commit": commit.item()}, recon


def train(vq: ShapesVQ, objective: str, *, steps: int, batch_size: int = 32, lr: float = 1e-3,
          seed: int = 0, r: int = 2, target_size: int = 64, width: int = 64, depth: int = 3,
          perceptual_weight: float = 0.5, commit_weight: float = 0.25, gan_weight: float = 0.1,
          gan_start: float = 0.3, log_every: int = 50, device: str | torch.device = "cpu",
          out: Path | None = None) -> tuple[LatentUpsampler, dict[str, Any]]:
    """Train one up-sampler for images of `target_size` px on `device`; returns it (on the CPU) and
    its held-out metrics (saved to `out` if given)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if target_size % (DOWNSAMPLE * r):
        raise ValueError(f"target size must be a multiple of {DOWNSAMPLE * r} px (tokenizer stride x r), "
                         f"got {target_size}")
    device = torch.device(device)
    vq = vq.eval().requires_grad_(False).to(device)
    grid = (target_size // DOWNSAMPLE, target_size // DOWNSAMPLE)
    module = LatentUpsampler(vq.codebook.detach().cpu(), r, grid, width=width, depth=depth, seed=seed,
                             active=vq.active).to(device)
    opt = torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=0.0)
    disc, d_opt = None, None
    if objective == "gan":
        with torch.random.fork_rng():
            torch.manual_seed(seed + 1)
            disc = PatchDiscriminator().to(device)
        d_opt = torch.optim.AdamW(disc.parameters(), lr=lr, betas=(0.5, 0.9))
    weights = {"perceptual": perceptual_weight, "commit": commit_weight}
    started = time.time()
    for step in range(steps):
        high_img, low_img = (x.to(device) for x in scene_pairs(seed, step, batch_size, target_size, r))
        with torch.no_grad():
            high, low = vq.encode(high_img), vq.encode(low_img)
        image = to_float(high_img)
        loss, terms, recon = up_loss(module, vq, objective, low, high, image, weights)
        down = F.cross_entropy(module.logits(module.down_latents(high)), low)
        loss = loss + down
        adversarial = disc is not None and recon is not None and step >= gan_start * steps
        if adversarial:
            g_loss = -disc(recon).mean()  # hinge generator loss
            loss = loss + gan_weight * g_loss
            terms["gan_g"] = g_loss.item()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if adversarial:
            d_loss = F.relu(1 - disc(image)).mean() + F.relu(1 + disc(recon.detach())).mean()
            d_opt.zero_grad(set_to_none=True)
            d_loss.backward()
            d_opt.step()
            terms["gan_d"] = d_loss.item()
        if log_every and (step % log_every == 0 or step == steps - 1):
            log.info("step %d/%d loss %.4f down %.4f %s (%.0fs)", step + 1, steps, float(loss), float(down),
                     " ".join(f"{k} {v:.4f}" for k, v in terms.items()), time.time() - started)
    metrics = evaluate(module, vq, r, target_size)
    metrics.update(objective=objective, steps=steps, batch_size=batch_size, lr=lr, seed=seed,
                   target_size=target_size, device=device.type, torch=torch.__version__)
    module = module.cpu()
    if out is not None:
        save_upsampler(module, out, metrics)
        log.info("saved %s: %s", out, metrics)
    return module, metrics


@torch.no_grad()
def evaluate(module: LatentUpsampler, vq: ShapesVQ, r: int, target_size: int, n: int = 64) -> dict[str, Any]:
    """Held-out token accuracy of up- and down-sampling and the pixel MSE of the up-sampled image."""
    module.eval()
    device = module.codebook.device
    high_img, low_img = (x.to(device) for x in scene_pairs(EVAL_SEED, 0, n, target_size, r))
    high, low = vq.encode(high_img), vq.encode(low_img)
    up = module.upsample_tokens(low)
    recon = to_float(vq.decode(up))
    module.train()
    return {"up_token_acc": float((up == high).float().mean()),
            "down_token_acc": float((module.downsample_tokens(high) == low).float().mean()),
            "up_pixel_mse": float(F.mse_loss(recon, to_float(high_img)))}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objective", choices=OBJECTIVES, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tokenizer", type=Path, default=None,
                    help="ShapesVQ .safetensors (default: the shipped, sha256-checked tokenizer)")
    ap.add_argument("--steps", type=int, default=600, help="the shipped weights: 600")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target-size", type=int, default=64,
                    help="the target's image size in px: 64 (x1 shapes world), 128 (x2)")
    ap.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.tokenizer is None:
        from harness.shapes.weights import verified
        a.tokenizer = verified("tokenizer.safetensors")
    train(load_tokenizer(a.tokenizer), a.objective, steps=a.steps, batch_size=a.batch_size, lr=a.lr,
          seed=a.seed, target_size=a.target_size, device=a.device, out=a.out)


if __name__ == "__main__":
    main()
