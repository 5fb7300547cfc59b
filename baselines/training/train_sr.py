"""Seeded training of a small pixel super-resolution network for MuLo-SD's `sr` up-sampler on a
shapes world (baselines/methods/sr_upsampler.py): the compact SRVGG architecture of Real-ESRGAN
(spandrel's `Compact`: conv + PReLU body, pixel shuffle, plus the nearest-up-sampled input), so
that spandrel detects and loads the weights as it loads an off-the-shelf checkpoint.

Pairs are what the up-sampler sees and what it should give: the input is a scene rendered at the
drafter's size and passed through the world's tokenizer (encode, decode: the drafter's images are
VQ reconstructions), the target is the same scene rendered at the target's size. Loss: L1 on
pixels in [0, 1]. Data: batch s of seed S is a pure function of (S, s)
(train_upsampler.scene_pairs); the initialisation is seeded. A checkpoint (weights, optimiser,
step) is written atomically every --every steps next to --out and a killed run resumes from it;
the weights' sha256, size and training facts go into sr_manifest.json beside --out.

    python -m baselines.training.train_sr --target-size 64 --steps 1500 \
        --out baselines/weights/sr_compact_16x16.safetensors            # x1: 32 -> 64 px
    python -m baselines.training.train_sr --target-size 128 --steps 1500 --world x2 \
        --out baselines/weights/sr_compact_32x32.safetensors            # x2: 64 -> 128 px
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import Tensor, nn

from baselines.training.train_upsampler import scene_pairs
from harness.shapes.vq import ShapesVQ, load_tokenizer
from harness.shapes.weights import WORLDS, verified

log = logging.getLogger(__name__)

EVAL_SEED = 12345
MANIFEST_NAME = "sr_manifest.json"  # baselines/methods/sr_upsampler.py checks shipped files against it


def compact(features: int = 16, convs: int = 4, scale: int = 2) -> nn.Module:
    """spandrel's SRVGGNetCompact (RGB in and out), `features` channels, `convs` body convolutions."""
    from spandrel.architectures.Compact import Compact

    return Compact(num_in_ch=3, num_out_ch=3, num_feat=features, num_conv=convs, upscale=scale, act_type="prelu")


@torch.no_grad()
def batch(tokenizer: ShapesVQ, seed: int, step: int, n: int, size: int, r: int) -> tuple[Tensor, Tensor]:
    """(input float [n, 3, size/r, size/r], target float [n, 3, size, size]) in [0, 1]."""
    high, low = scene_pairs(seed, step, n, size, r)
    low = tokenizer.decode(tokenizer.encode(low))  # what the drafter's decode looks like
    return low.float() / 255, high.float() / 255


def save_weights(model: nn.Module, path: Path, meta: dict[str, str]) -> None:
    """The network's state dict as safetensors (spandrel's key layout), atomically."""
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    tmp = path.with_name(path.name + ".tmp")
    save_file(state, str(tmp), metadata=meta)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def train(out: Path, size: int, world: str, steps: int, batch_size: int, seed: int, lr: float,
          every: int, features: int, convs: int, r: int = 2) -> float:
    """Train, checkpointing every `every` steps; returns the held-out L1 of the last step."""
    torch.manual_seed(seed)
    tokenizer = load_tokenizer(verified("tokenizer.safetensors", WORLDS[world])).eval()
    model = compact(features, convs, r)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    ckpt = out.with_name(out.name + ".ckpt")
    start = 0
    if ckpt.is_file():
        state = torch.load(ckpt, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = int(state["step"])
        log.info("resuming from %s at step %d", ckpt, start)
    held_in, held_out = batch(tokenizer, EVAL_SEED, 0, 64, size, r)
    for step in range(start, steps):
        x, y = batch(tokenizer, seed, step, batch_size, size, r)
        loss = F.l1_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (step + 1) % every == 0 or step + 1 == steps:
            with torch.no_grad():
                score = F.l1_loss(model(held_in).clamp(0, 1), held_out).item()
            log.info("step %d: train L1 %.4f, held-out L1 %.4f", step + 1, loss.item(), score)
            tmp = ckpt.with_name(ckpt.name + ".tmp")
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1}, tmp)
            os.replace(tmp, ckpt)
    with torch.no_grad():
        score = F.l1_loss(model(held_in).clamp(0, 1), held_out).item()
        bicubic = F.l1_loss(F.interpolate(held_in, scale_factor=r, mode="bicubic").clamp(0, 1), held_out).item()
    log.info("held-out L1: network %.4f, bicubic %.4f", score, bicubic)
    meta = {"world": world, "target_size": str(size), "steps": str(steps), "seed": str(seed),
            "held_out_l1": f"{score:.5f}", "bicubic_l1": f"{bicubic:.5f}"}
    save_weights(model, out, meta)
    record(out, {**meta, "architecture": f"Compact (SRVGGNetCompact), {features} features, {convs} convs, x{r}",
                 "parameters": str(sum(p.numel() for p in model.parameters()))})
    return score


def record(path: Path, facts: dict[str, str]) -> None:
    """Add `path`'s sha256, size and `facts` to the sr_manifest.json beside it (atomically)."""
    manifest = path.parent / MANIFEST_NAME
    data = json.loads(manifest.read_text()) if manifest.is_file() else {"files": {}}
    blob = path.read_bytes()
    data["files"][path.name] = {"sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob), **facts}
    tmp = manifest.with_name(manifest.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, manifest)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--target-size", type=int, default=64, help="the target's image size in pixels")
    ap.add_argument("--world", choices=sorted(WORLDS), default="x1", help="whose tokenizer makes the inputs")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--every", type=int, default=100, help="checkpoint every N steps")
    ap.add_argument("--features", type=int, default=16)
    ap.add_argument("--convs", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)
    train(args.out, args.target_size, args.world, args.steps, args.batch, args.seed, args.lr, args.every,
          args.features, args.convs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
