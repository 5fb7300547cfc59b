"""Train an EAGLE head (harness/models/eagle_head.py) for the target of any model bundle, as LANTERN
trains its LlamaGen drafters (entrypoints/generate_train_data.py, train_drafter/main.py):

- data: real image-token sequences with their captions, the target's features teacher-forced on
  them: its hidden states after the final norm at every sequence slot (caption slots included),
  10% of the captions replaced by the null caption (the unconditional rows CFG decodes with);
- head inputs: head index i pairs the feature of slot i (plus uniform noise, EAGLE's
  (U - 0.5) * noise * 512 / sequence length) with the token of slot i + 1 (0 on caption slots);
  it predicts the feature of slot i + 1; the loss covers the slots that predict image tokens;
- loss: SmoothL1 between predicted and target features + p_weight (0.1) x the soft cross-entropy of
  the target's output layer on them (-sum softmax(W f) log_softmax(W f^)), AdamW (lr 1e-4, betas
  0.9 / 0.95), linear warm-up over 3% of the steps then linear decay, gradients clipped at 0.5;
- the frozen embedding starts as a copy of the target's token embedding; the rest at N(0, 0.02),
  or from `--init` (a head of another grid of the same width, e.g. the x1 head for x2).

Targets: the project's GPT (shapes, LlamaGen, Tar, random) and the backbones with a `head_spec`
(Lumina-mGPT, Janus-Pro, Emu3: harness/models/eagle_head.TargetSpec), whose features, position code
(1-D rotary positions, end-of-row slots counted) and output layer come through the same hooks
(`hidden`, `positional`, `head_logits`, `token_embeddings`).

Data sources: `shapes` (fresh scenes of the shapes world rendered at the target's size and
tokenised by its tokenizer; batch s is a pure function of (seed, s)), `folder` (an img2dataset
folder of KEY.jpg/.png + KEY.txt: centre-cropped, resized to the target's size, VQ-encoded, captions
through the bundle's conditioner) and `self` (self-distilled, as LANTERN builds its Lumina-mGPT
data with entrypoints/generate_train_data.py: the target's own raster samples at temperature 1,
without guidance, for captions drawn from `--prompt-file`; batch s is a pure function of (seed, s)).
Resumable: a checkpoint (head, optimiser, step) every
`--ckpt-every` steps beside `--out`, picked up on restart.

    python -m baselines.training.train_eagle --model shapes --steps 1200 --threads 1 \
        --out harness/shapes/weights/eagle_head.safetensors --ship
    python -m baselines.training.train_eagle --model shapes_x2 --init harness/shapes/weights/eagle_head.safetensors \
        --steps 300 --threads 1 --out harness/shapes/weights_x2/eagle_head.safetensors --ship
    python -m baselines.training.train_eagle --model tar_1.5b_512 --data folder --data-dir laion_coco/ \
        --device cuda --batch-size 8 --steps 20000 --out heads/tar_1.5b_512.safetensors   (docs/eagle.md)
    python -m baselines.training.train_eagle --model janus_pro_7b --data self --prompt-file prompts.txt \
        --device cuda --batch-size 8 --steps 20000 --out heads/janus_pro_7b.safetensors
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from harness.api import Condition, ModelBundle, SamplingParams
from harness.models.eagle_head import EagleHead, EagleHeadConfig, head_spec, load_trained, random_head, save_head

log = logging.getLogger(__name__)

EVAL_SEED = 12345
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
# builders whose heads are named by eagle_head_file (cleared: the training target carries no head)
HEAD_FILE_BUILDERS = ("harness.models.llamagen.bundle.build", "harness.models.tar.bundle.build",
                      "harness.models.lumina.bundle.build", "harness.models.janus.bundle.build",
                      "harness.models.emu3.bundle.build")
# `--data self` without --prompt-file (smoke runs on the tiny stand-ins)
DEFAULT_PROMPTS = ("a red cube on a table", "two dogs in the snow", "a blue bird over a river at dusk",
                   "a bowl of fruit", "a city street at night", "a small boat on a lake")


# ----------------------------------------------------------------------------- model
def build_bundle(model: str, overrides: Sequence[str] = ()) -> tuple[ModelBundle, dict[str, Any]]:
    """The bundle of `conf/model/<model>.yaml` (with `model.KEY=VALUE` overrides) and its config."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from harness.__main__ import config_dir

    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"model={model}", *overrides])
    node = OmegaConf.to_container(cfg.model, resolve=True)
    assert isinstance(node, dict)
    for key in ("name", "sampling", "requires", "provides", "lacks", "eagle_head", "operating_points"):
        node.pop(key, None)
    builder = node.get("_target_")
    if builder == "harness.shapes.bundle.load":  # the target alone: no drafters, no head
        node.update(eagle_head=False, drafter=False, small_drafter=False)
    elif builder == "harness.models.random.bundle.build":
        node.update(eagle_head=False)
    elif builder in HEAD_FILE_BUILDERS[:2]:  # the project's GPT stacks (LlamaGen, Tar): no drafters either
        node.update(eagle_head_file=None, drafter_file=None, small_drafter_file=None)
    elif builder in HEAD_FILE_BUILDERS:  # Lumina-mGPT, Janus-Pro, Emu3: the target alone
        node.update(eagle_head_file=None)
        for key, off in (("drafter_repo", None), ("drafter_size", None), ("drafter", False), ("small_arch", None),
                         ("small_drafter_repo", None), ("small_drafter_local_dir", None)):
            if key in node:
                node[key] = off
    else:
        raise ValueError(f"model {model!r} (builder {builder}) has no EAGLE head training path: the project's "
                         "GPT stacks, Lumina-mGPT, Janus-Pro and Emu3 have one")
    return instantiate(node), node


# ----------------------------------------------------------------------------- data
def shapes_batches(bundle: ModelBundle, seed: int, batch_size: int, null: float,
                   start: int = 0) -> Iterator[tuple[Condition, Tensor]]:
    """Batches start, start + 1, ...: (condition [B] with null rows, tokens [B, N]) of freshly
    rendered shapes scenes; batch s is a pure function of (seed, s)."""
    from harness.shapes.captions import encoding_of
    from harness.shapes.train_gpt import batch

    target = bundle.target
    gpt = target.gpt
    encoding = encoding_of(gpt.cfg.prefix_len, gpt.cfg.word_vocab)
    step = start
    while True:
        cond, tokens = batch(step, seed, target.image_size, batch_size, target.tokenizer, null,
                             captions=encoding, named_order=True)
        yield cond, tokens
        step += 1


def folder_batches(bundle: ModelBundle, folder: Path, seed: int, batch_size: int, null: float,
                   start: int = 0) -> Iterator[tuple[Condition, Tensor]]:
    """Batches start, start + 1, ... of an img2dataset folder (KEY.jpg + KEY.txt), shuffled per
    epoch with `seed`: images centre-cropped and resized to the target's size, encoded by its
    tokenizer; captions through the bundle's conditioner, a `null` share of rows unconditional."""
    from PIL import Image

    keys = sorted(p for p in Path(folder).rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES
                  and p.with_suffix(".txt").is_file())
    if not keys:
        raise FileNotFoundError(f"{folder} holds no image + caption pairs (KEY.jpg with KEY.txt)")
    size = int(bundle.target.image_size)
    per_epoch = len(keys) // batch_size
    if per_epoch == 0:
        raise ValueError(f"{folder} has {len(keys)} image + caption pairs, fewer than one batch of "
                         f"{batch_size}")
    epoch, skip = divmod(start, per_epoch)
    while True:
        order = np.random.default_rng([seed, epoch]).permutation(len(keys))
        for lo in range(skip * batch_size, per_epoch * batch_size, batch_size):
            chosen = [keys[i] for i in order[lo:lo + batch_size]]
            images = []
            for path in chosen:
                img = Image.open(path).convert("RGB")
                side = min(img.size)
                left, top = (img.width - side) // 2, (img.height - side) // 2
                img = img.crop((left, top, left + side, top + side)).resize((size, size), Image.BICUBIC)
                images.append(torch.from_numpy(np.array(img)).permute(2, 0, 1))
            tokens = bundle.target.encode(torch.stack(images))
            texts = [p.with_suffix(".txt").read_text(encoding="utf-8").strip() for p in chosen]
            rng = np.random.default_rng([seed, epoch, lo])
            flip = torch.from_numpy(rng.random(batch_size) < null)
            index = torch.arange(batch_size) + batch_size * flip.long()
            yield bundle.condition(texts).with_null().select(index), tokens
        epoch, skip = epoch + 1, 0


def self_batches(bundle: ModelBundle, seed: int, batch_size: int, null: float, prompts: Sequence[str],
                 start: int = 0) -> Iterator[tuple[Condition, Tensor]]:
    """Batches start, start + 1, ...: (condition [B] with null rows, tokens [B, N]) where the tokens
    are the target's own raster samples (temperature 1, no guidance, no filter) for prompts drawn
    with (seed, s), a `null` share of rows unconditional; batch s is a pure function of (seed, s)."""
    from baselines.methods.raster import RasterDecoder

    if not prompts:
        raise ValueError("--data self needs prompts (--prompt-file: one prompt a line)")
    decoder = RasterDecoder(SamplingParams(temperature=1.0))
    step = start
    while True:
        rng = np.random.default_rng([seed, step])
        texts = [prompts[i] for i in rng.integers(0, len(prompts), batch_size)]
        flip = torch.from_numpy(rng.random(batch_size) < null)
        index = torch.arange(batch_size) + batch_size * flip.long()
        cond = bundle.condition(texts).with_null().select(index)
        seeds = [int(x) for x in rng.integers(0, 2**31 - 1, batch_size)]
        yield cond, decoder.generate(bundle, cond, seeds).tokens.clone()
        step += 1


# ----------------------------------------------------------------------------- training
@torch.no_grad()
def target_features(target, cond: Condition, tokens: Tensor) -> Tensor:  # noqa: ANN001
    """The target's hidden states after its final norm at sequence slots 0 .. P + N - 2, teacher
    forced on tokens [B, N]: [B, P + N - 1, dim] (a normal tensor, usable in autograd)."""
    b, n = tokens.shape
    target.setup_cache(b)
    target.prefill(cond)
    prefix = target.hidden.clone()
    positions = torch.arange(n - 1, device=target.device)
    target.forward(tokens[:, :-1].to(target.device), positions)
    return torch.cat([prefix, target.hidden.clone()], dim=1).float()


def head_inputs(tokens: Tensor, prefix: int) -> tuple[Tensor, Tensor]:
    """tokens [B, N] -> (the token after each head index [B, P + N - 1]: 0 on caption slots, then
    the image tokens; the sequence slot of that token [P + N - 1])."""
    b, n = tokens.shape
    ids = torch.cat([torch.zeros(b, prefix - 1, dtype=torch.long, device=tokens.device), tokens], dim=1)
    return ids, torch.arange(1, prefix + n, device=tokens.device)


def losses(head: EagleHead, target, feats: Tensor, tokens: Tensor, noise: float,  # noqa: ANN001
           gen: torch.Generator | None) -> dict[str, Tensor]:
    """The feature (SmoothL1) and soft cross-entropy losses of one batch, and the top-1 agreement of
    the drafted and the target's tokens, over the slots that predict image tokens (P - 1 .. T - 2)."""
    prefix = int(target.cache_len) - tokens.shape[1]
    ids, seq = head_inputs(tokens.to(feats.device), prefix)
    inputs = feats
    if noise:
        u = torch.rand(feats.shape, generator=gen, device="cpu").to(feats.device)
        inputs = feats + (u - 0.5) * noise * 512 / feats.shape[1]
    pred = head(inputs, ids, seq.expand(ids.shape[0], -1), target.positional)  # [B, T, dim]
    pred, want = pred[:, prefix - 1:-1], feats[:, prefix:]  # predicts slots P .. T - 1
    vloss = F.smooth_l1_loss(pred.float(), want, reduction="none").mean(-1).mean()
    logits_pred = target.head_logits(pred)  # [B, T, V] float, through the target's output layer
    with torch.no_grad():
        logits_want = target.head_logits(want)
    ploss = -(logits_want.softmax(-1) * logits_pred.log_softmax(-1)).sum(-1).mean()
    agree = (logits_pred.argmax(-1) == logits_want.argmax(-1)).float().mean()
    return {"vloss": vloss, "ploss": ploss, "top1": agree.detach()}


def initial_head(target, init: Path | None, seed: int) -> EagleHead:  # noqa: ANN001
    """A fresh head for `target` (random_head), or `init`'s weights in a head for this target."""
    spec = head_spec(target)
    with torch.no_grad():
        embeddings = target.token_embeddings.detach().float().cpu()
    head = random_head(spec, embeddings, seed)
    if init is not None:
        donor = load_trained(init)
        want = EagleHeadConfig.for_target(spec)
        if (donor.cfg.dim, donor.cfg.n_head, donor.cfg.vocab_size, donor.cfg.ffn_dim) != \
                (want.dim, want.n_head, want.vocab_size, want.ffn_dim):
            raise ValueError(f"--init {init}: a head of width {donor.cfg.dim}, {donor.cfg.n_head} heads, "
                             f"{donor.cfg.vocab_size} codes, feed-forward {donor.cfg.ffn_dim}; this target "
                             f"needs {want.dim}, {want.n_head}, {want.vocab_size}, {want.ffn_dim}")
        head.load_state_dict(donor.state_dict())
    return head


def lr_at(step: int, steps: int, lr: float, warmup: float = 0.03) -> float:
    """Linear warm-up over `warmup` of the steps, then linear decay to 0."""
    w = max(1, int(warmup * steps))
    return lr * (step + 1) / w if step < w else lr * max(0.0, (steps - step) / max(1, steps - w))


Batch = tuple[Condition, Tensor]


def train(bundle: ModelBundle, stream: Callable[[int], Iterator[Batch]], *, steps: int, out: Path,
          lr: float = 1e-4, p_weight: float = 0.1, noise: float = 0.2, seed: int = 0,
          init: Path | None = None, ckpt_every: int = 50, log_every: int = 25,
          eval_batches: list[Batch] | None = None,
          info: dict[str, Any] | None = None) -> tuple[EagleHead, dict[str, Any]]:
    """Train a head for bundle.target on stream(start) (the batches from step `start` on); resumable
    from `out`.ckpt. Returns the head (float32, on the target's device) and its metrics."""
    target = bundle.target
    target.requires_grad_(False)
    device = target.device
    head = initial_head(target, init, seed).to(device).train()
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    ckpt = out.with_suffix(".ckpt")
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    start, ema, seconds = 0, None, 0.0
    if ckpt.is_file():
        state = torch.load(ckpt, map_location=device, weights_only=True)
        head.load_state_dict(state["head"])
        opt.load_state_dict(state["opt"])
        start, ema, seconds = int(state["step"]), state.get("ema"), float(state.get("seconds", 0.0))
        log.info("resumed %s at step %d", ckpt, start)
    gen = torch.Generator()
    batches = stream(start)
    began = time.time()
    for step in range(start, steps):
        gen.manual_seed(seed * 1_000_003 + step)  # the noise of step s depends on (seed, s) only
        cond, tokens = next(batches)
        feats = target_features(target, cond, tokens)
        terms = losses(head, target, feats, tokens, noise, gen)
        loss = terms["vloss"] + p_weight * terms["ploss"]
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_value_(params, 0.5)
        opt.step()
        value = {k: float(v.detach()) for k, v in terms.items()}
        ema = value if ema is None else {k: 0.95 * ema[k] + 0.05 * value[k] for k in value}
        done = step + 1
        if log_every and (done % log_every == 0 or done == steps):
            log.info("step %d/%d vloss %.4f ploss %.4f top1 %.3f (ema %.4f / %.4f / %.3f) %.0fs", done, steps,
                     value["vloss"], value["ploss"], value["top1"], ema["vloss"], ema["ploss"], ema["top1"],
                     seconds + time.time() - began)
        if ckpt_every and (done % ckpt_every == 0 or done == steps):
            tmp = ckpt.with_suffix(".ckpt.tmp")
            torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "step": done, "ema": ema,
                        "seconds": seconds + time.time() - began}, tmp)
            os.replace(tmp, ckpt)
    seconds += time.time() - began
    head.eval()
    metrics: dict[str, Any] = {"steps": steps, "train_ema": ema, "train_seconds": round(seconds, 1),
                               "params_trained": sum(p.numel() for p in params)}
    if eval_batches:
        metrics["heldout"] = evaluate(head, target, eval_batches)
    metrics.update(info or {})
    save_head(head, out, metrics)
    ckpt.unlink(missing_ok=True)  # finished: a rerun starts afresh
    log.info("saved %s: %s", out, json.dumps(metrics))
    return head, metrics


@torch.no_grad()
def evaluate(head: EagleHead, target, batches: list[Batch]) -> dict[str, float]:  # noqa: ANN001
    """Held-out feature loss, soft cross-entropy and top-1 agreement (no noise)."""
    sums: dict[str, float] = {}
    for cond, tokens in batches:
        terms = losses(head, target, target_features(target, cond, tokens), tokens, 0.0, None)
        for k, v in terms.items():
            sums[k] = sums.get(k, 0.0) + float(v) / len(batches)
    return sums


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True,
                    help="a model config: shapes, shapes_x2, llamagen_xl_512, tar_1.5b_512, ...")
    ap.add_argument("--out", type=Path, required=True, help="the head's .safetensors")
    ap.add_argument("--data", choices=["shapes", "folder", "self"], default=None,
                    help="default: shapes for the shapes worlds, else folder")
    ap.add_argument("--data-dir", type=Path, default=None, help="folder data: KEY.jpg + KEY.txt pairs")
    ap.add_argument("--prompt-file", type=Path, default=None,
                    help="self data: one prompt a line (default: a few built-in prompts, smoke runs only)")
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--p-weight", type=float, default=0.1, help="weight of the soft cross-entropy")
    ap.add_argument("--noise", type=float, default=0.2, help="EAGLE's uniform feature noise")
    ap.add_argument("--null", type=float, default=0.1, help="share of null captions")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init", type=Path, default=None, help="start from this head's weights")
    ap.add_argument("--ckpt-every", type=int, default=50)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--eval-batches", type=int, default=4)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--ship", action="store_true",
                    help="list the head in the manifest of --out's folder (the shipped shapes weights)")
    ap.add_argument("overrides", nargs="*",
                    help="model config overrides, e.g. model.local_dir=/data/llamagen")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if a.threads:
        torch.set_num_threads(a.threads)
    bundle, node = build_bundle(a.model, a.overrides)
    bundle.to(a.device)
    data = a.data or ("shapes" if node.get("_target_") == "harness.shapes.bundle.load" else "folder")
    if data == "folder" and a.data_dir is None:
        ap.error("--data folder needs --data-dir")
    prompts = DEFAULT_PROMPTS
    if a.prompt_file is not None:
        prompts = tuple(line.strip() for line in a.prompt_file.read_text(encoding="utf-8").splitlines() if line.strip())

    def stream(seed: int, start: int = 0) -> Iterator[tuple[Condition, Tensor]]:
        if data == "shapes":
            return shapes_batches(bundle, seed, a.batch_size, a.null, start)
        if data == "self":
            return self_batches(bundle, seed, a.batch_size, a.null, prompts, start)
        return folder_batches(bundle, a.data_dir, seed, a.batch_size, a.null, start)

    held = stream(EVAL_SEED)
    eval_batches = [next(held) for _ in range(a.eval_batches)] if data in ("shapes", "self") else None
    info = {"model": a.model, "data": data, "batch_size": a.batch_size, "lr": a.lr, "p_weight": a.p_weight,
            "noise": a.noise, "null": a.null, "seed": a.seed, "init": None if a.init is None else a.init.name,
            "device": a.device, "threads": a.threads, "torch": torch.__version__}
    _, metrics = train(bundle, lambda start: stream(a.seed, start), steps=a.steps, out=a.out, lr=a.lr,
                       p_weight=a.p_weight, noise=a.noise, seed=a.seed, init=a.init, ckpt_every=a.ckpt_every,
                       log_every=a.log_every, eval_batches=eval_batches, info=info)
    if a.ship:
        from harness.shapes.weights import add_to_manifest

        recipe = {"command": "python -m baselines.training.train_eagle " + " ".join(
            str(x) for x in (argv if argv is not None else __import__("sys").argv[1:]))}
        add_to_manifest(a.out.parent, a.out.name, "eagle_head", metrics, recipe)
        log.info("listed %s in %s/manifest.json", a.out.name, a.out.parent)


if __name__ == "__main__":
    main()
