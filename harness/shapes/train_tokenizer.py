"""Training recipe of the shapes-world tokenizer (ShapesVQ) on freshly sampled scenes.

Each step renders a new batch from a numpy generator seeded with (seed, step, size), half of the
images at 64 px and half at 32 px (the same weights tokenize both resolutions). The loss is an
edge-weighted L1 plus L2 pixel loss and the VQ codebook/commitment losses; codes unused for
`restart_every` steps are re-initialised to random encoder latents of the current batch
(dead-code restarts). Checkpoints are atomic and hold everything needed to continue bit for bit:
model, optimizer, step, RNG states and code-usage state.

    python -m harness.shapes.train_tokenizer --out .cache/shapes_tokenizer --steps 1000
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor

from harness.shapes import scenes
from harness.shapes.vq import ShapesVQ, save_tokenizer, to_float, to_uint8

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.pt"
WEIGHTS = "tokenizer.safetensors"
METRICS = "metrics.json"
SIZES = (64, 32)
EVAL_SEED = 20_240_601     # held-out scenes, the same for every training seed
PIXEL_TOLERANCE = 24       # |recon - orig| <= this on every channel counts as "right colour"


# ----------------------------------------------------------------------------- data

def palette() -> Tensor:
    """uint8 [K, 3]: the scene colours followed by the background (K = 11)."""
    colours = [*scenes.COLORS.values(), scenes.BACKGROUND]
    return torch.tensor(colours, dtype=torch.uint8)


def render_batch(rng: np.random.Generator, n: int, size: int) -> Tensor:
    """n freshly sampled scenes rendered at `size` -> uint8 [n, 3, size, size]."""
    images = np.stack([scenes.render(scenes.sample_scene(rng), size) for _ in range(n)])
    return torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()


def training_batch(seed: int, step: int, n: int, size: int) -> Tensor:
    """The reproducible batch of `step`: uint8 [n, 3, size, size]."""
    return render_batch(np.random.default_rng([seed, step, size]), n, size)


def eval_images(n: int) -> dict[int, Tensor]:
    """The held-out set: the same n scenes at every size in SIZES -> {size: uint8 [n, 3, s, s]}."""
    rng = np.random.default_rng(EVAL_SEED)
    chosen = [scenes.sample_scene(rng) for _ in range(n)]
    out = {}
    for size in SIZES:
        images = np.stack([scenes.render(s, size) for s in chosen])
        out[size] = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()
    return out


# ----------------------------------------------------------------------------- losses, metrics

def edge_mask(x: Tensor) -> Tensor:
    """Pixels that differ from one of their 4 neighbours: [B, 3, H, W] -> bool [B, 1, H, W]."""
    dh = (x[..., :, 1:] != x[..., :, :-1]).any(dim=1, keepdim=True)
    dv = (x[..., 1:, :] != x[..., :-1, :]).any(dim=1, keepdim=True)
    mask = torch.zeros_like(x[:, :1], dtype=torch.bool)
    mask[..., :, 1:] |= dh
    mask[..., :, :-1] |= dh
    mask[..., 1:, :] |= dv
    mask[..., :-1, :] |= dv
    return mask


def pixel_loss(recon: Tensor, target: Tensor, edge_weight: float) -> Tensor:
    """Edge-weighted L1 plus L2; recon, target float [B, 3, H, W] in [-1, 1] -> scalar."""
    weight = 1.0 + edge_weight * edge_mask(target).float()
    err = recon.float() - target
    return (weight * err.abs()).sum() / (3 * weight.sum()) + err.square().mean()


def snap(images: Tensor, colours: Tensor) -> Tensor:
    """Nearest palette entry per pixel: uint8 [B, 3, H, W], colours [K, 3] -> int64 [B, H, W]."""
    dist = (images.float().unsqueeze(1) - colours.float()[None, :, :, None, None]).square().sum(2)
    return dist.argmin(dim=1)


def colour_iou(orig: Tensor, recon: Tensor, k: int) -> Tensor:
    """IoU of each colour's mask between two snapped images, for the colours present in `orig`
    (this follows every shape's outline): int64 [B, H, W] x2 -> float [n_present]."""
    ious = []
    for c in range(k):
        a, b = orig == c, recon == c
        present = a.flatten(1).any(dim=1)
        inter = (a & b).flatten(1).sum(1).float()
        union = (a | b).flatten(1).sum(1).float()
        ious.append((inter / union.clamp(min=1))[present])
    return torch.cat(ious)


def reconstruction_metrics(orig: Tensor, recon: Tensor) -> dict[str, float]:
    """Pixel-level quality of uint8 reconstructions [B, 3, H, W] of renders `orig`.

    palette_acc: fraction of pixels whose reconstruction snaps to the original's palette colour;
    pixel_acc: fraction within PIXEL_TOLERANCE on every channel; *_min: worst image;
    colour_iou: per image and colour present, IoU of the colour's snapped mask (shape outlines).
    """
    colours = palette()
    a, b = snap(orig, colours), snap(recon, colours)
    right = (a == b).flatten(1).float()
    close = ((orig.int() - recon.int()).abs().amax(dim=1) <= PIXEL_TOLERANCE).flatten(1).float()
    iou = colour_iou(a, b, len(colours))
    return {
        "palette_acc": right.mean().item(),
        "palette_acc_min": right.mean(1).min().item(),
        "pixel_acc": close.mean().item(),
        "l1": (orig.float() - recon.float()).abs().mean().item() / 255.0,
        "colour_iou_mean": iou.mean().item(),
        "colour_iou_min": iou.min().item(),
    }


def usage_stats(counts: Tensor) -> dict[str, float]:
    """Code-usage histogram int [V] -> fraction of codes used and perplexity of the usage."""
    p = counts.double() / counts.sum().clamp(min=1)
    entropy = -(p[p > 0] * p[p > 0].log()).sum()
    return {"usage": (counts > 0).double().mean().item(), "perplexity": entropy.exp().item()}


@torch.no_grad()
def evaluate(model: ShapesVQ, n_images: int) -> dict[str, Any]:
    """Encode/decode the held-out set at every size -> {"64": metrics, "32": metrics}."""
    model.eval()
    out: dict[str, Any] = {}
    for size, images in eval_images(n_images).items():
        recons, counts = [], torch.zeros(model.codebook_size, dtype=torch.long)
        for chunk in images.split(64):
            tokens = model.encode(chunk)
            counts += torch.bincount(tokens.flatten(), minlength=model.codebook_size)
            recons.append(model.decode(tokens))
        out[str(size)] = {**reconstruction_metrics(images, torch.cat(recons)), **usage_stats(counts)}
    model.train()
    return out


# ----------------------------------------------------------------------------- training state

def learning_rate(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warm-up to `peak`, then cosine decay to peak/20 at `steps`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


def make_optimizer(model: ShapesVQ, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW; weight decay on conv kernels only (not on biases or the codebook)."""
    decay = [p for n, p in model.named_parameters() if p.dim() == 4]
    rest = [p for n, p in model.named_parameters() if p.dim() != 4]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.99))


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """torch.save to a temporary file, then an atomic rename onto `path`."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@torch.no_grad()
def restart_dead_codes(model: ShapesVQ, optimizer: torch.optim.Optimizer, dead: Tensor,
                       latents: Tensor, generator: torch.Generator) -> None:
    """Move the `dead` codes (bool [V]) onto random latents [N, D] (plus a little noise) and
    clear their Adam moments."""
    n = int(dead.sum())
    pick = torch.randint(latents.shape[0], (n,), generator=generator)
    noise = 0.01 * torch.randn(n, model.code_dim, generator=generator)
    weight = model.embedding.weight
    weight[dead] = F.normalize(latents[pick] + noise, dim=1) * weight.norm(dim=1).mean()
    for key in ("exp_avg", "exp_avg_sq"):
        if key in optimizer.state.get(weight, {}):
            optimizer.state[weight][key][dead] = 0.0


# ----------------------------------------------------------------------------- training

def train_tokenizer(
    out_dir: Path,
    *,
    steps: int,
    batch_size: int,
    seed: int,
    lr: float,
    resume: bool = True,
    log_every: int,
    ckpt_every: int,
    channels: tuple[int, int, int] = (32, 64, 96),
    res_blocks: int = 1,
    codebook_size: int = 512,
    code_dim: int = 8,
    edge_weight: float = 4.0,
    weight_decay: float = 0.01,
    warmup: int = 100,
    restart_every: int = 100,
    bf16: bool = True,
    eval_images: int = 256,
) -> dict[str, Any]:
    """Train ShapesVQ in `out_dir` (resuming from its checkpoint when `resume`), then write
    `tokenizer.safetensors`, `metrics.json` and reconstruction grids; returns the final metrics.

    `batch_size` images per step: half rendered at 64 px, half at 32 px. Dead-code restarts run
    every `restart_every` steps (0: never) during the first 80% of training.
    """
    if batch_size < 2:
        raise ValueError(f"batch_size must be >= 2 (half at 64 px, half at 32 px), got {batch_size}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = {"steps": steps, "batch_size": batch_size, "seed": seed, "lr": lr,
              "channels": list(channels), "res_blocks": res_blocks, "codebook_size": codebook_size,
              "code_dim": code_dim, "edge_weight": edge_weight, "weight_decay": weight_decay,
              "warmup": warmup, "restart_every": restart_every, "bf16": bf16}
    torch.manual_seed(seed)
    model = ShapesVQ(codebook_size=codebook_size, code_dim=code_dim, channels=tuple(channels),
                     res_blocks=res_blocks)
    optimizer = make_optimizer(model, lr, weight_decay)
    generator = torch.Generator().manual_seed(seed)
    last_used = torch.zeros(codebook_size, dtype=torch.long)
    start, elapsed, cpu = 0, 0.0, 0.0

    ckpt_path = out_dir / CHECKPOINT
    if resume and ckpt_path.exists():
        state = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        if state["config"] != config:
            diff = {k: (state["config"].get(k), v) for k, v in config.items()
                    if state["config"].get(k) != v}
            raise ValueError(f"{ckpt_path} was written with other settings (checkpoint, now): "
                             f"{diff}; pass resume=False or another out_dir")
        model.load_state_dict(state["model"], strict=True)
        optimizer.load_state_dict(state["optimizer"])
        generator.set_state(state["restart_rng"])
        torch.set_rng_state(state["torch_rng"])
        last_used, start = state["last_used"], state["step"]
        elapsed, cpu = state["elapsed"], state["cpu_seconds"]
        log.info("resumed from %s at step %d", ckpt_path, start)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("ShapesVQ %s: %.3fM params; training steps %d..%d", model.config, n_params / 1e6,
             start, steps)

    n64 = batch_size // 2
    window = {"loss": 0.0, "pix": 0.0, "codebook": 0.0, "commit": 0.0, "acc": 0.0, "n": 0}
    counts = torch.zeros(codebook_size, dtype=torch.long)
    t_window = time.perf_counter()
    model.train()
    for step in range(start, steps):
        t0, c0 = time.perf_counter(), time.process_time()
        batches = [training_batch(seed, step, n64, 64), training_batch(seed, step, batch_size - n64, 32)]
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, steps, lr, warmup)
        loss = torch.zeros(())
        parts = {"pix": 0.0, "codebook": 0.0, "commit": 0.0}
        recons, used = [], torch.zeros(codebook_size, dtype=torch.bool)
        for images in batches:
            x = to_float(images)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                recon, vq_losses, indices = model(x)
            pix = pixel_loss(recon, x, edge_weight)
            sub = pix + vq_losses["codebook"] + vq_losses["commit"]
            loss = loss + sub / len(batches)
            parts["pix"] += pix.item() / len(batches)
            for k in ("codebook", "commit"):
                parts[k] += vq_losses[k].item() / len(batches)
            counts += torch.bincount(indices.flatten(), minlength=codebook_size)
            used[indices.flatten()] = True
            recons.append(to_uint8(recon.detach()))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        last_used[used] = step + 1

        if restart_every and (step + 1) % restart_every == 0 and step + 1 <= 0.8 * steps:
            dead = last_used <= step + 1 - restart_every
            if dead.any():
                with torch.no_grad():
                    z = torch.cat([model.encoder(to_float(b)).permute(0, 2, 3, 1).flatten(0, 2)
                                   for b in batches])
                restart_dead_codes(model, optimizer, dead, z, generator)
                last_used[dead] = step + 1
                log.info("step %d: restarted %d dead codes", step + 1, int(dead.sum()))
        elapsed += time.perf_counter() - t0
        cpu += time.process_time() - c0

        window["loss"] += loss.item()
        window["acc"] += sum(reconstruction_metrics(b, r)["palette_acc"]
                             for b, r in zip(batches, recons)) / len(batches)
        for k, v in parts.items():
            window[k] += v
        window["n"] += 1
        done = step + 1
        if done % log_every == 0 or done == steps:
            n, dt = window["n"], time.perf_counter() - t_window
            stats = usage_stats(counts)
            log.info("step %d/%d loss %.4f pix %.4f codebook %.4f commit %.4f train_acc %.4f "
                     "usage %.3f ppl %.0f lr %.2e %.1f img/s elapsed %.0fs cpu %.0fs", done, steps,
                     window["loss"] / n, window["pix"] / n, window["codebook"] / n,
                     window["commit"] / n, window["acc"] / n, stats["usage"], stats["perplexity"],
                     optimizer.param_groups[0]["lr"], n * batch_size / dt, elapsed, cpu)
            window = dict.fromkeys(window, 0.0)
            window["n"] = 0
            counts.zero_()
            t_window = time.perf_counter()
        if done % ckpt_every == 0 or done == steps:
            save_checkpoint(ckpt_path, {
                "model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": done,
                "torch_rng": torch.get_rng_state(), "restart_rng": generator.get_state(),
                "last_used": last_used, "config": config, "elapsed": elapsed,
                "cpu_seconds": cpu})

    save_tokenizer(model, out_dir / WEIGHTS)
    metrics = {"step": steps, "train_seconds": elapsed, "cpu_seconds": cpu, "params": n_params,
               "config": config,
               "eval": evaluate(model, eval_images) if eval_images else {}}
    (out_dir / METRICS).write_text(json.dumps(metrics, indent=2))
    if eval_images:
        save_grids(model, out_dir)
    for size, m in metrics["eval"].items():
        log.info("eval %s px: %s", size, " ".join(f"{k} {v:.4f}" for k, v in m.items()))
    return metrics


@torch.no_grad()
def save_grids(model: ShapesVQ, out_dir: Path, n: int = 16) -> None:
    """recon_{size}.png: 2 rows per size, held-out originals above their reconstructions."""
    for size, images in eval_images(n).items():
        recon = model.decode(model.encode(images))
        rows = [torch.cat(list(batch), dim=2) for batch in (images, recon)]
        grid = torch.cat(rows, dim=1).permute(1, 2, 0).numpy()
        Image.fromarray(grid).save(out_dir / f"recon_{size}.png")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="run folder (checkpoint, weights)")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--batch-size", type=int, default=64, help="half 64 px, half 32 px")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--no-resume", action="store_true", help="ignore an existing checkpoint")
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--ckpt-every", type=int, default=200)
    parser.add_argument("--channels", type=int, nargs=3, default=(32, 64, 96))
    parser.add_argument("--res-blocks", type=int, default=1)
    parser.add_argument("--edge-weight", type=float, default=4.0)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--restart-every", type=int, default=100)
    parser.add_argument("--fp32", action="store_true", help="no bf16 autocast")
    parser.add_argument("--eval-images", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    torch.set_num_threads(args.threads)
    train_tokenizer(args.out, steps=args.steps, batch_size=args.batch_size, seed=args.seed,
                    lr=args.lr, resume=not args.no_resume, log_every=args.log_every,
                    ckpt_every=args.ckpt_every, channels=tuple(args.channels),
                    res_blocks=args.res_blocks, edge_weight=args.edge_weight,
                    weight_decay=args.weight_decay, warmup=args.warmup,
                    restart_every=args.restart_every, bf16=not args.fp32,
                    eval_images=args.eval_images)


if __name__ == "__main__":
    main()
