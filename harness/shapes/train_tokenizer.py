"""Training recipe of the shapes-world tokenizer (ShapesVQ) on freshly sampled scenes.

Each step renders a new batch from numpy generators seeded with (seed, step, size): a sub-batch
at 64 px and one at 32 px (half/half by default; the same weights tokenize both resolutions).
The loss is an edge-weighted L1 plus L2 pixel loss and the VQ codebook/commitment losses; codes
unused for `restart_every` steps are re-initialised to random encoder latents of the current
batch (dead-code restarts). Checkpoints are atomic and hold everything needed to continue bit for bit:
model, optimizer, step, RNG states and code-usage state.

    python -m harness.shapes.train_tokenizer --out .cache/shapes_tokenizer --steps 600
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import time
from dataclasses import dataclass
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
ACTIVE_SEED = 20_240_602   # scenes that decide which codes the trained encoder may emit
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
def active_codes(model: ShapesVQ, n_images: int, seed: int = ACTIVE_SEED) -> Tensor:
    """The codes the (unrestricted) encoder emits on n_images fresh renders at each size in
    SIZES -> bool [V]."""
    model.eval()
    used = torch.zeros(model.codebook_size, dtype=torch.bool)
    for size in SIZES:
        rng = np.random.default_rng([seed, size])
        for start in range(0, n_images, 256):
            used[model.encode(render_batch(rng, min(256, n_images - start), size)).unique()] = True
    return used


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
        recon = torch.cat(recons)
        out[str(size)] = {**reconstruction_metrics(images, recon), **usage_stats(counts)}
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
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": rest, "weight_decay": 0.0}]
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

@dataclass
class TrainState:
    """Everything a checkpoint restores (with the run config it was written under)."""

    model: ShapesVQ
    optimizer: torch.optim.AdamW
    generator: torch.Generator  # draws of the dead-code restarts
    last_used: Tensor           # int64 [V]: 1 + the last step that used each code (0: never)
    step: int = 0
    elapsed: float = 0.0        # wall seconds spent in training steps
    cpu: float = 0.0            # process CPU seconds spent in training steps


def new_state(config: dict[str, Any]) -> TrainState:
    """Freshly initialised model (seeded), optimizer and restart generator."""
    torch.manual_seed(config["seed"])
    model = ShapesVQ(codebook_size=config["codebook_size"], code_dim=config["code_dim"],
                     channels=tuple(config["channels"]), res_blocks=config["res_blocks"],
                     encoder=config.get("encoder", "conv"))
    return TrainState(model=model,
                      optimizer=make_optimizer(model, config["lr"], config["weight_decay"]),
                      generator=torch.Generator().manual_seed(config["seed"]),
                      last_used=torch.zeros(config["codebook_size"], dtype=torch.long))


def checkpoint(state: TrainState, config: dict[str, Any]) -> dict[str, Any]:
    return {"model": state.model.state_dict(), "optimizer": state.optimizer.state_dict(),
            "step": state.step, "torch_rng": torch.get_rng_state(),
            "restart_rng": state.generator.get_state(), "last_used": state.last_used,
            "elapsed": state.elapsed, "cpu_seconds": state.cpu, "config": config}


def restore(state: TrainState, path: Path, config: dict[str, Any]) -> None:
    """Load checkpoint `path` into `state`; refuses one written under another config."""
    saved = torch.load(path, map_location="cpu", weights_only=False)
    if saved["config"] != config:
        diff = {k: (saved["config"].get(k), config.get(k)) for k in saved["config"].keys() | config
                if saved["config"].get(k) != config.get(k)}
        raise ValueError(f"{path} was written with other settings {{key: (checkpoint, now)}}: "
                         f"{diff}; pass resume=False or use another out_dir")
    state.model.load_state_dict(saved["model"], strict=True)
    state.optimizer.load_state_dict(saved["optimizer"])
    state.generator.set_state(saved["restart_rng"])
    torch.set_rng_state(saved["torch_rng"])
    state.last_used, state.step = saved["last_used"], saved["step"]
    state.elapsed, state.cpu = saved["elapsed"], saved["cpu_seconds"]


def train_step(state: TrainState, config: dict[str, Any]) -> dict[str, Any]:
    """One optimizer step on the batches of `state.step` (64 px then 32 px sub-batch), then
    dead-code restarts when due; advances `state.step`. Returns the step's losses, its training
    palette accuracy and its code histogram ("counts", int64 [V])."""
    step, model = state.step, state.model
    n32 = round(config["batch_size"] * config["low_res_share"])
    batches = [training_batch(config["seed"], step, config["batch_size"] - n32, 64),
               training_batch(config["seed"], step, n32, 32)]
    for group in state.optimizer.param_groups:
        group["lr"] = learning_rate(step, config["steps"], config["lr"], config["warmup"])
    total = torch.zeros(())
    stats: dict[str, Any] = {"pix": 0.0, "codebook": 0.0, "commit": 0.0, "acc": 0.0,
                             "counts": torch.zeros(model.codebook_size, dtype=torch.long)}
    for images in batches:
        x = to_float(images)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config["bf16"]):
            recon, vq_losses, indices = model(x)
        pix = pixel_loss(recon, x, config["edge_weight"])
        total = total + (pix + vq_losses["codebook"] + vq_losses["commit"]) / len(batches)
        for key, value in (("pix", pix), *vq_losses.items()):
            stats[key] += value.item() / len(batches)
        acc = reconstruction_metrics(images, to_uint8(recon.detach()))["palette_acc"]
        stats["acc"] += acc / len(batches)
        stats["counts"] += torch.bincount(indices.flatten(), minlength=model.codebook_size)
    state.optimizer.zero_grad(set_to_none=True)
    total.backward()
    state.optimizer.step()
    state.step = step + 1
    state.last_used[stats["counts"] > 0] = state.step
    stats["loss"] = total.item()

    every = config["restart_every"]
    if every and state.step % every == 0 and state.step <= 0.8 * config["steps"]:
        dead = state.last_used <= state.step - every
        if dead.any():
            with torch.no_grad():
                latents = torch.cat([model.encoder(to_float(b)).permute(0, 2, 3, 1).flatten(0, 2)
                                     for b in batches])
            restart_dead_codes(model, state.optimizer, dead, latents, state.generator)
            state.last_used[dead] = state.step
            log.info("step %d: restarted %d dead codes", state.step, int(dead.sum()))
    return stats


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
    encoder: str = "conv",
    codebook_size: int = 512,
    code_dim: int = 8,
    low_res_share: float = 0.5,
    edge_weight: float = 4.0,
    weight_decay: float = 0.01,
    warmup: int = 100,
    restart_every: int = 100,
    bf16: bool = True,
    eval_images: int = 256,
    active_images: int = 8192,
) -> dict[str, Any]:
    """Train ShapesVQ in `out_dir` (resuming from its checkpoint when `resume`), then write
    `tokenizer.safetensors`, `metrics.json` and reconstruction grids; returns the final metrics.

    `batch_size` images per step, a `low_res_share` of them rendered at 32 px and the rest at
    64 px (two sub-batches whose losses weigh equally). Dead-code restarts run every
    `restart_every` steps (0: never) during the first 80% of training. After training the encoder
    is restricted to the codes it emits on `active_images` fresh renders per size (0: keep all).
    """
    n32 = round(batch_size * low_res_share)
    if not 0 < n32 < batch_size:
        raise ValueError(f"batch_size {batch_size} x low_res_share {low_res_share} must leave at "
                         f"least one image at each of 64 and 32 px")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = {"steps": steps, "batch_size": batch_size, "seed": seed, "lr": lr,
              "channels": list(channels), "res_blocks": res_blocks, "encoder": encoder,
              "codebook_size": codebook_size, "code_dim": code_dim,
              "low_res_share": low_res_share, "edge_weight": edge_weight,
              "weight_decay": weight_decay, "warmup": warmup, "restart_every": restart_every,
              "bf16": bf16}
    state = new_state(config)
    ckpt_path = out_dir / CHECKPOINT
    if resume and ckpt_path.exists():
        restore(state, ckpt_path, config)
        log.info("resumed from %s at step %d", ckpt_path, state.step)
    n_params = sum(p.numel() for p in state.model.parameters())
    log.info("ShapesVQ %s: %.3fM params; training steps %d..%d", state.model.config,
             n_params / 1e6, state.step, steps)

    state.model.train()
    window: list[dict[str, Any]] = []
    t_window = time.perf_counter()
    while state.step < steps:
        t0, c0 = time.perf_counter(), time.process_time()
        window.append(train_step(state, config))
        state.elapsed += time.perf_counter() - t0
        state.cpu += time.process_time() - c0
        if state.step % log_every == 0 or state.step == steps:
            log_window(state, config, window, time.perf_counter() - t_window)
            window, t_window = [], time.perf_counter()
        if state.step % ckpt_every == 0 or state.step == steps:
            save_checkpoint(ckpt_path, checkpoint(state, config))

    model = state.model.eval()
    if active_images:
        model.restrict(active_codes(model, active_images))
    save_tokenizer(model, out_dir / WEIGHTS)
    metrics = {"step": steps, "train_seconds": state.elapsed, "cpu_seconds": state.cpu,
               "params": n_params, "config": config, "active_codes": int(model.active.sum()),
               "eval": evaluate(model, eval_images) if eval_images else {}}
    (out_dir / METRICS).write_text(json.dumps(metrics, indent=2))
    if eval_images:
        save_grids(model, out_dir)
    for size, m in metrics["eval"].items():
        log.info("eval %s px: %s", size, " ".join(f"{k} {v:.4f}" for k, v in m.items()))
    return metrics


def log_window(state: TrainState, config: dict[str, Any], window: list[dict[str, Any]],
               seconds: float) -> None:
    """Log the mean losses, training accuracy, code usage and speed of the last steps."""
    mean = {k: sum(s[k] for s in window) / len(window)
            for k in ("loss", "pix", "codebook", "commit", "acc")}
    usage = usage_stats(torch.stack([s["counts"] for s in window]).sum(0))
    log.info("step %d/%d loss %.4f pix %.4f codebook %.4f commit %.4f train_acc %.4f usage %.3f "
             "ppl %.0f lr %.2e %.1f img/s elapsed %.0fs cpu %.0fs", state.step, config["steps"],
             mean["loss"], mean["pix"], mean["codebook"], mean["commit"], mean["acc"],
             usage["usage"], usage["perplexity"], state.optimizer.param_groups[0]["lr"],
             len(window) * config["batch_size"] / seconds, state.elapsed, state.cpu)


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
    parser.add_argument("--batch-size", type=int, default=64, help="images per step, 64 + 32 px")
    parser.add_argument("--low-res-share", type=float, default=0.5, help="share rendered at 32 px")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--no-resume", action="store_true", help="ignore an existing checkpoint")
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--ckpt-every", type=int, default=200)
    parser.add_argument("--channels", type=int, nargs=3, default=(32, 64, 96))
    parser.add_argument("--res-blocks", type=int, default=1)
    parser.add_argument("--encoder", choices=["conv", "patch"], default="conv",
                        help="conv: ~50 px receptive field; patch: each token sees its own 4x4 patch")
    parser.add_argument("--edge-weight", type=float, default=4.0)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--restart-every", type=int, default=100)
    parser.add_argument("--fp32", action="store_true", help="no bf16 autocast")
    parser.add_argument("--eval-images", type=int, default=256)
    parser.add_argument("--active-images", type=int, default=8192,
                        help="renders per size that decide the codes the encoder may emit (0: all codes)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    torch.set_num_threads(args.threads)
    train_tokenizer(args.out, steps=args.steps, batch_size=args.batch_size, seed=args.seed,
                    lr=args.lr, resume=not args.no_resume, log_every=args.log_every,
                    ckpt_every=args.ckpt_every, channels=tuple(args.channels),
                    res_blocks=args.res_blocks, encoder=args.encoder, low_res_share=args.low_res_share,
                    edge_weight=args.edge_weight, weight_decay=args.weight_decay,
                    warmup=args.warmup, restart_every=args.restart_every, bf16=not args.fp32,
                    eval_images=args.eval_images, active_images=args.active_images)


if __name__ == "__main__":
    main()
