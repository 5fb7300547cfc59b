"""Train one shapes-world GPT (target at 64 px -> 16x16 tokens, drafter at 32 px -> 8x8 tokens;
`--image-size 128` gives the x2 world's 32x32 target) on an endless, seeded stream of freshly
rendered scenes tokenised by the shared tokenizer.

Resumable: an atomic checkpoint (model, optimiser, step) is written every `ckpt_every` steps and
picked up on restart. The data of step s depends only on (seed, s), so a resumed run sees exactly
the batches an uninterrupted run would.

    python -m harness.shapes.train_gpt --role target --tokenizer T.safetensors --out DIR --steps N
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch.utils.data import DataLoader, Dataset

from harness.models.condition import TextCondition
from harness.shapes.captions import ENCODINGS, TAGS, encoding_of
from harness.shapes.gpt import ShapesConfig, ShapesGPT
from harness.shapes.parallel_masks import Gap, hidden_of, sample_gaps
from harness.shapes.scenes import render, sample_scene
from harness.shapes.vq import ShapesVQ, load_tokenizer

log = logging.getLogger(__name__)

DOWNSAMPLE = 4
ROLES = {"target": 64, "drafter": 32}  # image size per role; tokens = size / 4 per side


def role_size(role: str, size: int | None = None) -> int:
    """Image size (pixels per side) a role trains at: `size` when given, else ROLES's (the small
    drafter shares the target's resolution)."""
    if role not in ("target", "drafter", "small_drafter"):
        raise ValueError(f"role must be target, drafter or small_drafter, got {role!r}")
    size = ROLES["target" if role == "small_drafter" else role] if size is None else size
    if size < 8 or size % DOWNSAMPLE:
        raise ValueError(f"image size must be a multiple of {DOWNSAMPLE} and >= 8, got {size}")
    return size


def gpt_config(role: str, vocab_size: int, dim: int, n_layer: int, n_head: int,
               cond_broadcast: bool = False, word_pos: bool = False, rope_fraction: float = 1.0,
               captions: str = "words", size: int | None = None) -> ShapesConfig:
    """The GPT architecture of a shapes-world role ("target", "drafter" or "small_drafter") reading
    captions in encoding `captions` ("words" or "phrases", captions.ENCODINGS), at image size
    `size` (default: the role's, role_size)."""
    if captions not in ENCODINGS:
        raise ValueError(f"captions must be one of {sorted(ENCODINGS)}, got {captions!r}")
    _, slots, vocab = ENCODINGS[captions]
    grid = role_size(role, size) // DOWNSAMPLE
    # prefix_rope "zero" (LlamaGen's choice): caption slots get zero queries and keys, so every
    # image position sees the caption with position-independent scores (unrotated "identity" keys
    # give scores that turn with the image position's rotary angle). Measured on 8x8 drafters
    # trained 400 steps from scratch on colour captions only: a wrong colour word cost 3.6 nats per
    # image with "zero", 1.2 with "identity".
    return ShapesConfig(vocab_size=vocab_size, grid=(grid, grid), dim=dim, n_layer=n_layer, n_head=n_head,
                        prefix_len=slots, caption_dim=64, word_vocab=vocab, cond_dropout=0.1,
                        prefix_rope="zero", cond_broadcast=cond_broadcast, word_pos=word_pos,
                        rope_fraction=rope_fraction)


def batch(step: int, seed: int, size: int, batch_size: int, tokenizer: ShapesVQ,
          cond_dropout: float, tags: tuple[str, ...] = TAGS,
          captions: str = "words", named_order: bool = False) -> tuple[TextCondition, torch.Tensor]:
    """The training batch of `step`: (condition [B], tokens [B, (size/4)^2]), a function of its
    arguments only; captions are drawn from `tags` and encoded as `captions`; with `named_order`
    two-object scenes follow the caption's order (scenes.scene_for_caption)."""
    rng = np.random.default_rng([seed, step])
    scenes = [sample_scene(rng, tags, named_order) for _ in range(batch_size)]
    images = torch.from_numpy(np.stack([render(s, size) for s in scenes])).permute(0, 3, 1, 2)
    tokens = tokenizer.encode(images).flatten(1)
    null = torch.from_numpy(rng.random(batch_size) < cond_dropout)
    ids = ENCODINGS[captions][0]([s.caption for s in scenes])
    return TextCondition(null=null, ids=ids), tokens


@dataclass
class StepData(Dataset):
    """Everything step s of a run trains on, a function of (run settings, s) only: the batch
    (`batch`) and the parallel-decoding context gaps (parallel_masks.sample_gaps; compact, so
    workers hand over kilobytes, and hidden_of builds the [B, N, N] masks where they are used).
    Index i is step `start + i`; a DataLoader with workers renders steps ahead of the GPU in
    other processes and yields exactly what the training process would compute itself."""

    start: int
    steps: int
    seed: int
    size: int
    batch_size: int
    tokenizer: ShapesVQ
    cond_dropout: float
    focus_steps: int
    focus_tags: tuple[str, ...]
    tags: tuple[str, ...]
    captions: str
    named_order: bool
    grid: tuple[int, int]
    parallel_fraction: float
    parallel_windows: tuple[int, ...]

    def __len__(self) -> int:
        return max(0, self.steps - self.start)

    def __getitem__(self, i: int) -> tuple[TextCondition, torch.Tensor, list[Gap]]:
        """-> (condition [B], tokens [B, grid^2], the batch's context gaps)."""
        step = self.start + i
        mix = tuple(self.focus_tags) if step < self.focus_steps else tuple(self.tags)
        with torch.no_grad():
            cond, tokens = batch(step, self.seed, self.size, self.batch_size, self.tokenizer, self.cond_dropout,
                                 mix, self.captions, self.named_order)
        gaps = sample_gaps(np.random.default_rng([self.seed, step, 1]), tokens.shape[0], self.grid,
                           self.parallel_fraction, self.parallel_windows)
        return cond, tokens, gaps


def step_batches(data: StepData, workers: int) -> DataLoader:
    """The steps of `data` in order; `workers` > 0 renders them in that many processes."""
    return DataLoader(data, batch_size=None, shuffle=False, num_workers=workers,
                      prefetch_factor=4 if workers else None, persistent_workers=False)


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to 10% of `lr`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


GROWN = {"word_pos"}  # parameters a child stage may add to its parent's (zero-initialised)
# Tensors whose shape follows the caption encoding (slots x vocabulary): a child that reads another
# encoding than its parent starts these afresh and inherits the rest (image embeddings, blocks).
CAPTION_TENSORS = {"word_embeddings.weight", "word_pos", "cls_embedding.uncond_embedding",
                   "cond_broadcast.weight", "cond_broadcast.bias"}


def initialise_from(gpt: ShapesGPT, path: Path) -> None:
    """Load a parent GPT's weights into `gpt`: every parent tensor must exist with its shape,
    and `gpt` may only add the zero-initialised parameters in GROWN. A parent trained on another
    caption encoding (prefix slots, vocabulary) gives everything but its CAPTION_TENSORS."""
    from harness.shapes.weights import load_gpt

    parent = load_gpt(path)
    state = parent.state_dict()
    fresh: set[str] = set()
    if (parent.cfg.prefix_len, parent.cfg.word_vocab) != (gpt.cfg.prefix_len, gpt.cfg.word_vocab):
        fresh = CAPTION_TENSORS & set(gpt.state_dict())
        state = {k: v for k, v in state.items() if k not in CAPTION_TENSORS}
    try:
        missing, unexpected = gpt.load_state_dict(state, strict=False)
    except RuntimeError as err:  # a tensor of another shape
        raise ValueError(f"{path} does not fit this GPT: {err}") from err
    lacking = sorted(set(missing) - GROWN - fresh)
    if unexpected or lacking:
        raise ValueError(f"{path} does not fit this GPT: missing {lacking}, "
                         f"unexpected {sorted(unexpected)}")


def _save_ckpt(path: Path, gpt: ShapesGPT, opt: torch.optim.Optimizer, step: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"model": gpt.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
    os.replace(tmp, path)


def save_gpt(gpt: ShapesGPT, path: Path, extra: dict[str, Any], dtype: torch.dtype = torch.float32) -> None:
    """Weights (as `dtype`) in safetensors with the ShapesConfig (and `extra`) in the metadata; atomic."""
    cfg = asdict(gpt.cfg)
    state = {k: v.detach().to(dtype).contiguous().cpu() for k, v in gpt.state_dict().items()}
    tmp = path.with_name(path.name + ".tmp")
    save_file(state, str(tmp), metadata={"config": json.dumps(cfg), "extra": json.dumps(extra)})
    os.chmod(tmp, 0o644)  # safetensors creates the file owner-only
    os.replace(tmp, path)


def caption_encoding(gpt: ShapesGPT) -> str:
    """The caption encoding ("words", "phrases") a shapes GPT reads."""
    return encoding_of(gpt.cfg.prefix_len, gpt.cfg.word_vocab)


@torch.no_grad()
def evaluate_loss(gpt: ShapesGPT, tokenizer: ShapesVQ, size: int, seed: int, batches: int = 4) -> float:
    """Mean token cross-entropy on held-out batches (a seed stream disjoint from training). The
    scenes use the free layout (not `named_order`) for every model, so recipes compare."""
    gpt.eval()
    losses, device = [], gpt.output.weight.device
    for i in range(batches):
        cond, tokens = batch(i, seed + 10_000, size, 32, tokenizer, 0.0, TAGS, caption_encoding(gpt))
        cond, tokens = cond.to(device), tokens.to(device)
        logits = gpt.forward_train(cond, tokens)
        losses.append(F.cross_entropy(logits.flatten(0, 1), tokens.flatten()).item())
    gpt.train()
    return float(np.mean(losses))


def train_gpt(role: str, tokenizer_path: Path, out_dir: Path, *, steps: int, batch_size: int = 32,
              lr: float = 2e-3, warmup: int = 100, dim: int = 256, n_layer: int = 4, n_head: int = 4,
              seed: int = 0, ckpt_every: int = 100, log_every: int = 25, bf16: bool = True,
              init_from: Path | None = None, focus_steps: int = 0,
              focus_tags: tuple[str, ...] = ("colors",), tags: tuple[str, ...] = TAGS,
              cond_broadcast: bool = False, word_pos: bool = False, rope_fraction: float = 1.0,
              captions: str = "words", named_order: bool = False, parallel_fraction: float = 0.0,
              parallel_windows: tuple[int, ...] = (1, 2, 4, 8), device: str = "cpu",
              size: int | None = None, workers: int = 0) -> dict[str, Any]:
    """Train (or resume) one role; writes `<role>.safetensors` and returns final metrics.

    Curriculum: the first `focus_steps` steps draw captions only from `focus_tags`, then from
    `tags` (default: GenEval's six, uniform; a tag listed twice is drawn twice as often). Colour
    captions on one shape make the caption the only source of the colour, and the
    model learns to read the prefix within a few hundred steps; on the uniform mix alone a drafter
    had not started to after 1300 steps.

    `cond_broadcast`: also add the projected caption to every image token's input (ShapesConfig);
    with the same curriculum a drafter read colour and shape words after 800 steps about as well
    as one without it after 1800.

    `word_pos`: a learned embedding per caption slot (ShapesConfig.word_pos), so the model can tell
    "a circle left of a square" from "a square left of a circle".

    `rope_fraction`: the fraction of each head's dimension pairs that rotate (ShapesConfig); below 1
    image queries can pick caption slots by content.

    `captions`: the caption encoding ("words": the grammar's words, one slot each; "phrases": one
    token per noun phrase, captions.PHRASES). A child of a parent with another encoding inherits
    everything but the caption tensors (CAPTION_TENSORS), which start afresh.

    `named_order`: two-object scenes show their objects in raster order in the order the caption
    names them (scenes.scene_for_caption), so a raster model meets the first-named object first.

    `parallel_fraction`: the fraction of each batch trained with the context gaps of parallel
    decoding (harness/shapes/parallel_masks.py: a random region, the whole grid half of the time,
    decoded ZipAR-style with a window from `parallel_windows`); the rest keeps the causal mask.
    The masks of step s depend only on (seed, s), like its batch.

    `device`: where the GPT trains ("cpu", "cuda"); scenes are rendered and tokenised on the CPU,
    so the batches are the same on every device (the floats of the updates are not).

    `size`: the image size in pixels (default: the role's, role_size); 128 gives the x2 world's
    32x32-token target. `workers`: processes that render batches ahead of the training step
    (StepData); the batches are the same for every count. At 128 px one process renders and
    tokenises about 4 batches of 32 per second, too few to keep a GPU busy.

    `init_from`: a trained GPT (safetensors) of the same architecture to start from, e.g. the
    target starts from the half-resolution drafter as LlamaGen's stage 2 starts from stage 1 (the
    rotary table is a buffer, so weights transfer across grids). The only parameter the parent may
    lack is `word_pos`, which then starts at zero (the child computes what the parent did)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(tokenizer_path)
    size = role_size(role, size)
    torch.manual_seed(seed)
    gpt = ShapesGPT(gpt_config(role, tokenizer.codebook_size, dim, n_layer, n_head, cond_broadcast, word_pos,
                         rope_fraction, captions, size)).train()
    decay = [p for n, p in gpt.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in gpt.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95))
    if init_from is not None:
        initialise_from(gpt, Path(init_from))
        log.info("%s: initialised from %s", role, init_from)
    gpt.to(device)
    ckpt, start = out_dir / f"{role}.ckpt", 0
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=True, map_location=device)
        gpt.load_state_dict(state["model"], strict=True)
        opt.load_state_dict(state["opt"])
        start = int(state["step"])
        log.info("%s: resuming at step %d", role, start)
    log.info("%s: %.2fM parameters, grid %s", role, gpt.num_params() / 1e6, gpt.cfg.grid)
    t0, loss_ema = time.perf_counter(), None
    data = StepData(start, steps, seed=seed, size=size, batch_size=batch_size, tokenizer=tokenizer,
                    cond_dropout=gpt.cfg.cond_dropout, focus_steps=focus_steps, focus_tags=tuple(focus_tags),
                    tags=tuple(tags), captions=captions, named_order=named_order, grid=gpt.cfg.grid,
                    parallel_fraction=parallel_fraction, parallel_windows=tuple(parallel_windows))
    for step, (cond, tokens, gaps) in enumerate(step_batches(data, workers), start=start):
        cond, tokens = cond.to(device), tokens.to(device)
        hidden = hidden_of(gaps, tokens.shape[0], device)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
            logits = gpt.forward_train(cond, tokens, hidden=hidden)
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(gpt.parameters(), 1.0)
        opt.step()
        loss_ema = loss.item() if loss_ema is None else 0.95 * loss_ema + 0.05 * loss.item()
        if (step + 1) % log_every == 0:
            rate = (step + 1 - start) / (time.perf_counter() - t0)
            log.info("%s step %d/%d loss %.4f (ema %.4f) %.2f step/s", role, step + 1, steps, loss.item(), loss_ema, rate)
        if (step + 1) % ckpt_every == 0 or step + 1 == steps:
            _save_ckpt(ckpt, gpt, opt, step + 1)
    metrics = {"role": role, "steps": steps, "train_loss_ema": loss_ema,
               "heldout_loss": evaluate_loss(gpt, tokenizer, size, seed), "params": gpt.num_params(),
               "image_size": size, "device": str(device), "torch": torch.__version__,
               "batch_size": batch_size, "lr": lr, "seed": seed, "focus_steps": focus_steps, "word_pos": word_pos,
               "rope_fraction": rope_fraction, "captions": captions, "named_order": named_order,
               "parallel_fraction": parallel_fraction, "parallel_windows": list(parallel_windows)}
    save_gpt(gpt.eval().cpu(), out_dir / f"{role}.safetensors", metrics)
    log.info("%s done: %s", role, metrics)
    return metrics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", choices=["target", "drafter", "small_drafter"], required=True)
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu", help="where the GPT trains: cpu, cuda, cuda:1, ...")
    ap.add_argument("--image-size", type=int, default=None,
                    help="training image size in pixels (default: 64 for target/small_drafter, 32 for drafter)")
    ap.add_argument("--workers", type=int, default=0, help="processes rendering batches ahead of the step")
    ap.add_argument("--captions", default="words", choices=list(ENCODINGS), help="caption encoding")
    ap.add_argument("--init-from", type=Path, default=None, help="a trained GPT to start from")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--focus-steps", type=int, default=0)
    ap.add_argument("--cond-broadcast", action="store_true", help="add the caption to every image token")
    ap.add_argument("--word-pos", action="store_true", help="learned embedding per caption slot")
    ap.add_argument("--named-order", action="store_true", help="two objects appear in the caption's order")
    ap.add_argument("--parallel-fraction", type=float, default=0.0,
                    help="fraction of each batch trained with parallel-decoding context gaps")
    ap.add_argument("--parallel-windows", type=int, nargs="+", default=[1, 2, 4, 8],
                    help="ZipAR windows the parallel-decoding gaps are drawn with")
    ap.add_argument("--rope-fraction", type=float, default=1.0, help="fraction of rotating dimension pairs")
    ap.add_argument("--tags", nargs="+", default=list(TAGS), choices=list(TAGS),
                    help="caption tags to draw from (a tag listed twice is drawn twice as often)")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if a.threads:
        torch.set_num_threads(a.threads)
    train_gpt(a.role, a.tokenizer, a.out, steps=a.steps, batch_size=a.batch_size, lr=a.lr, dim=a.dim,
              n_layer=a.n_layer, n_head=a.n_head, seed=a.seed, device=a.device, captions=a.captions,
              init_from=a.init_from, warmup=a.warmup, focus_steps=a.focus_steps,
              cond_broadcast=a.cond_broadcast, word_pos=a.word_pos, named_order=a.named_order,
              tags=tuple(a.tags), rope_fraction=a.rope_fraction, parallel_fraction=a.parallel_fraction,
              parallel_windows=tuple(a.parallel_windows), size=a.image_size, workers=a.workers)


if __name__ == "__main__":
    main()
