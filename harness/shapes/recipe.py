"""The seeded training recipe that reproduces the shipped shapes-world weights:
tokenizer first, then the GPT stages (the half-resolution 8x8 drafter, the small same-resolution
drafter, the 16x16 target from the drafter, its refinement and two stages that teach it the
contexts of parallel decoding), then the manifest.

    python -m harness.shapes.recipe --out .cache/shapes_recipe            # train (resumes)
    python -m harness.shapes.recipe --out .cache/shapes_recipe --install  # + copy into the package

The x2 world (`model=shapes_x2`) doubles the resolution: a 32x32-token target at 128 px, its
r = 2 drafter (a 16x16 GPT at 64 px: the x1 target trained further) and a small same-resolution
drafter. Its three stages start from the x1 world's shipped weights (`--from-shipped` adopts them
instead of retraining the x1 chain); the two at 128 px want a GPU (about 7 s per 32 images on 2
CPU cores), the drafter at 64 px about 71 min on 2 CPU cores:

    python -m harness.shapes.recipe --out .cache/shapes_x2 --world x2 --from-shipped \
        --device cuda --workers 12 --install

Every stage checkpoints and resumes; rerunning the command after an interruption continues
where it stopped. Stages already finished (their .safetensors exists) are skipped.

With `--install`, the last stage trains the installed target's EAGLE head (EAGLE-2 and LANTERN,
docs/eagle.md) with `python -m baselines.training.train_eagle` in a subprocess (the harness does not import
baselines/) and lists it in the manifest: EAGLE_HEADS; one thread each, about 25 minutes per world.

Wall time on 2 CPU cores (from the logs of the shipped run): tokenizer 5 min; drafter 26 min at
two threads with the small drafter (18 min, one thread) beside it; target 27 min, target_refine
16.5 min, target_parallel and target_parallel_refine 17 min each at two threads: about 110 min.
Float results depend on the thread count, so a bitwise reproduction needs the same split; and the
shipped target_parallel started from the shipped (float16) target_refine, where a rerun starts from
its float32 weights.
"""
from __future__ import annotations

import argparse
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from harness.shapes.train_gpt import save_gpt, train_gpt
from harness.shapes.train_tokenizer import train_tokenizer
from harness.shapes.weights import (MANIFEST, WEIGHTS_DIR, WORLDS, add_to_manifest, load_gpt, read_manifest,
                                    write_manifest)

log = logging.getLogger(__name__)

# The recipe of record: changing a value here changes the shipped weights.
# The patch encoder makes every token a function of its own 4x4 pixels: a flat background patch
# always gets the same code (token entropy 1.3 nats at 64 px, against 4.6 with the conv encoder).
TOKENIZER = dict(steps=600, batch_size=64, seed=0, lr=2e-3, log_every=50, ckpt_every=200, encoder="patch")
# GPT stages in training order: stage name -> train_gpt arguments, plus `role` (architecture and
# resolution) and `init_from` (an earlier stage to start from). SHIPPED names the stage whose
# weights ship under each role's file name.
# Every stage reads captions as noun-phrase tokens (captions.PHRASES), attends to them by content
# (rope_fraction 0.5: half of each head's dimension pairs never rotate, so image queries can pick
# a caption slot; no broadcast), and sees two-object scenes laid out in the caption's order.
CAPTIONS = dict(captions="phrases", word_pos=True, named_order=True, rope_fraction=0.5)
GPTS: dict[str, dict[str, Any]] = {
    "drafter": dict(role="drafter", steps=3000, batch_size=32, lr=2e-3, dim=256, n_layer=4, n_head=4,
                    seed=1, focus_steps=400, **CAPTIONS),
    "small_drafter": dict(role="small_drafter", steps=1500, batch_size=32, lr=2e-3, dim=256, n_layer=1,
                          n_head=4, seed=2, focus_steps=400, **CAPTIONS),
    # The target starts from the trained drafter (LlamaGen trains its 512 px stage from the 256 px
    # one), which already reads the caption (see train_gpt's curriculum).
    "target": dict(role="target", steps=1500, batch_size=32, lr=1e-3, dim=256, n_layer=4, n_head=4,
                   seed=0, init_from="drafter", warmup=20, **CAPTIONS),
    # A second cosine cycle at half the rate (192 prompts, cfg 1.5: 0.750 -> 0.755).
    "target_refine": dict(role="target", steps=900, batch_size=32, lr=5e-4, dim=256, n_layer=4, n_head=4,
                          seed=3, init_from="target", warmup=20, **CAPTIONS),
    # Two cycles with the context gaps of parallel decoding on half of each batch
    # (parallel_masks.py: ZipAR windows 1, 2, 4, 8 over the whole grid or a random rectangle), so
    # that ZipAR and MuLo-SD's island-parallel resampler meet contexts the target was trained on.
    "target_parallel": dict(role="target", steps=900, batch_size=32, lr=5e-4, dim=256, n_layer=4, n_head=4,
                            seed=4, init_from="target_refine", warmup=20, parallel_fraction=0.5, **CAPTIONS),
    "target_parallel_refine": dict(role="target", steps=900, batch_size=32, lr=3e-4, dim=256, n_layer=4,
                                   n_head=4, seed=5, init_from="target_parallel", warmup=20,
                                   parallel_fraction=0.5, **CAPTIONS),
}
# Measured (`benchmarks/shapes_world.py --prompts 192 --cfg 1.5`, target raster, GenEval single /
# two / counting / colors / position / color_attr / overall): target_refine 1.000 / 0.844 / 0.438 / 0.875 / 0.500 / 0.875 /
# 0.755. The previous recipe of record (word captions; zero-rotary caption slots plus a broadcast
# of the caption onto every image token; free layouts) scored 1.000 / 0.812 / 0.750 / 0.969 /
# 0.344 / 0.125 / 0.667 and read captions as a bag of words (benchmarks/caption_binding.py: 0.0
# nats between a caption and its word-swapped twin). Content attention alone (words, rope_fraction
# 0.5, no broadcast) bound colours (8.1 nats) but drew the second object of two_object captions as
# a copy of the first (0.526). 600 fine-tuning steps of that previous target with named order
# (color_attr drawn twice as often) learned no binding (gap 0.09 nats; 0.59), nor with phrase
# tokens on top (caption tensors afresh; gap 0.27; 0.48).
# Parallel-decoding gaps (GenEval, cfg 1.5; raster on 576 prompts with benchmarks/shapes_world.py,
# the others on 384 prompts with the benchmark's sampling and seeds):
#                                  raster  ZipAR w8  MuLo-SD  resampler alone (k=1, tau=1)
#   target_refine (no gaps)        0.79    0.729     0.477    0.552 (96 prompts)
#   + 900 steps, gaps on 1/4       0.774   0.763     0.490
#   target_parallel (1/2)          0.748   -         0.586    0.630
#   target_parallel_refine (1/2)   0.748   0.773     0.633    0.646
# The gaps cost raster about 4 points and give MuLo-SD 16 (ZipAR 4); a quarter of each batch is
# too little to learn them. Three further stages from target_parallel_refine (900 steps, lr 3e-4;
# not shipped) raised raster and lowered MuLo-SD; where measured, the resampler alone stayed about
# 10 points under raster, as on the shipped stage (0.646 against 0.747 on those 384 prompts):
#   fraction 0.75, windows (2, 4), seed 7  0.776*  -         0.570    -
#   fraction 0.5, windows (2,), seed 8     0.794*  -         0.549    0.682
#   fraction 0.75, windows (2,), seed 9    0.786*  -         0.591    0.693
#   (* raster on the 384 prompts of the other columns)
# Those 384 prompts at global seed 0 are the sample every stage above was chosen on, and they
# flatter MuLo-SD: on the same prompts at seed 1, MuLo-SD against raster is 0.424 / 0.766 with
# target_refine and 0.576 / 0.800 with target_parallel_refine (gaps -0.34 and -0.22, not -0.30
# and -0.11); on 1536 prompts at seed 0 the shipped stage gives 0.556 / 0.766 (docs/shapes_world.md). The two
# unshipped window-2 stages at seed 1: 0.518 / 0.797 (seed 8) and 0.513 / 0.760 (seed 9), gaps
# -0.28 and -0.25, so not shipping them stands.
SHIPPED = {"target": "target_parallel_refine", "drafter": "drafter", "small_drafter": "small_drafter"}

# The x2 world: the same architecture at 128 px (32x32 tokens). The target starts from the shipped
# x1 target (rotary positions are a buffer, so weights transfer across grids; LlamaGen trains its
# 512 px stage from the 256 px one) and keeps learning the gaps of parallel decoding, with the
# windows a 32-wide grid adds; the small drafter (draft-model SD, LANTERN) starts from the x1 one.
X2 = dict(size=128, **CAPTIONS)
GPTS.update({
    "x2_target": dict(role="target", steps=3000, batch_size=64, lr=5e-4, dim=256, n_layer=4, n_head=4,
                      seed=10, init_from="target_parallel_refine", warmup=50, parallel_fraction=0.5,
                      parallel_windows=(1, 2, 4, 8, 16), **X2),
    "x2_small_drafter": dict(role="small_drafter", steps=1500, batch_size=32, lr=1e-3, dim=256, n_layer=1,
                             n_head=4, seed=11, init_from="small_drafter", warmup=50, **X2),
    # The r = 2 drafter: the x1 target (a 16x16 GPT at 64 px, as the drafter's resolution must be)
    # trained 2400 steps further with target_parallel_refine's settings (the x2 target trained 3000
    # steps of batch 64 beyond the x1 chain, the x1 target as drafter none); 0.56 steps/s on 2 CPU
    # cores. Drafting with ZipAR window 8 at 64 px (768 prompts, seed 1): 0.736 -> 0.794 (+0.059
    # +- 0.016 paired); raster order 0.775 -> 0.792. The x1 target as it ships drafted the x2
    # world until then (docs/shapes_world.md, "The x2 world").
    "x2_drafter": dict(role="target", steps=2400, batch_size=32, lr=3e-4, dim=256, n_layer=4, n_head=4,
                       seed=13, init_from="target_parallel_refine", warmup=20, parallel_fraction=0.5,
                       size=64, **CAPTIONS),
})
# Stages each world trains by default, and the stage shipped under each role's file name.
WORLD_STAGES = {"x1": [s for s in GPTS if not s.startswith("x2_")],
                "x2": ["x2_target", "x2_small_drafter", "x2_drafter"]}
SHIPPED_X2 = {"target": "x2_target", "small_drafter": "x2_small_drafter",
              "drafter": "x2_drafter"}
WORLD_SHIPPED = {"x1": SHIPPED, "x2": SHIPPED_X2}
# Files a world takes unchanged from another world's folder: both worlds share the tokenizer (its
# 4x4 patch codes do not depend on image size).
BORROWED = {"x1": {}, "x2": {"tokenizer.safetensors": ("x1", "tokenizer.safetensors")}}


# The EAGLE head of each world's target (python -m baselines.training.train_eagle, after the target is
# installed): x1 from scratch, x2 from the x1 head (a head has no position parameters of its own).
EAGLE_HEADS: dict[str, dict[str, Any]] = {
    "x1": dict(steps=1000, batch_size=32, seed=0, threads=1),
    "x2": dict(steps=450, batch_size=8, seed=0, threads=1, init="x1"),
}
HEAD_FILE = "eagle_head.safetensors"


def stage_eagle_head(out: Path, world: str, dest: Path) -> None:
    """Train the EAGLE head of the target installed in `dest` (EAGLE_HEADS[world]) in `out`/eagle_head
    (its checkpoints stay there), copy it into `dest` and list it in the manifest."""
    spec = dict(EAGLE_HEADS[world])
    model = "shapes" if world == "x1" else f"shapes_{world}"
    work = out / "eagle_head"
    work.mkdir(parents=True, exist_ok=True)
    init = spec.pop("init", None)
    args = ["-m", "baselines.training.train_eagle", "--model", model, "--out", str(work / HEAD_FILE),
            *(f"--{k.replace('_', '-')}={v}" for k, v in spec.items()), f"model.weights_dir={dest}"]
    if init is not None:
        args.append(f"--init={WORLDS[init] / HEAD_FILE}")
    log.info("training the EAGLE head: python %s", " ".join(args))
    with open(work / "train.log", "a") as logfile:
        subprocess.run([sys.executable, *args], check=True, stdout=logfile, stderr=subprocess.STDOUT)
    shutil.copyfile(work / HEAD_FILE, dest / HEAD_FILE)
    from safetensors import safe_open

    with safe_open(str(dest / HEAD_FILE), framework="pt") as f:
        metrics = json.loads((f.metadata() or {}).get("info", "{}"))
    add_to_manifest(dest, HEAD_FILE, "eagle_head", metrics, {"command": "python " + " ".join(args)})


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def stage_tokenizer(out: Path) -> dict[str, Any]:
    folder = out / "tokenizer"
    if (folder / "tokenizer.safetensors").exists() and (folder / "metrics.json").exists():
        return json.loads((folder / "metrics.json").read_text())
    return train_tokenizer(folder, **TOKENIZER)


def weights_of(out: Path, stage: str) -> Path:
    """The safetensors file a finished GPT stage leaves in the working folder."""
    return out / stage / f"{GPTS[stage]['role']}.safetensors"


def finished(out: Path, stage: str) -> bool:
    """Whether `stage` left its weights and metrics in the working folder."""
    return weights_of(out, stage).exists() and (out / stage / "metrics.json").exists()


def stage_order(stages: list[str], out: Path | None = None) -> list[str]:
    """`stages` plus every stage they start from, each after the stage it starts from; with `out`,
    the chain stops at stages already finished there (their parents are not needed)."""
    order: list[str] = []

    def visit(stage: str) -> None:
        if stage in order:
            return
        parent = GPTS[stage].get("init_from")
        if parent is not None and not (out is not None and finished(out, stage)):
            visit(parent)
        order.append(stage)

    for stage in stages:
        visit(stage)
    return order


def stage_gpt(out: Path, stage: str, device: str = "cpu", workers: int = 0) -> dict[str, Any]:
    folder = out / stage
    if finished(out, stage):
        return json.loads((folder / "metrics.json").read_text())
    kwargs = dict(GPTS[stage])
    role = kwargs.pop("role")
    if "init_from" in kwargs:
        kwargs["init_from"] = weights_of(out, kwargs["init_from"])
    metrics = train_gpt(role, out / "tokenizer" / "tokenizer.safetensors", folder, device=device,
                        workers=workers, **kwargs)
    (folder / "metrics.json").write_text(json.dumps(metrics, indent=2))
    return metrics


def adopt_shipped(out: Path, source: Path = WEIGHTS_DIR) -> list[str]:
    """Seed the working folder with the shipped x1 weights in `source` (tokenizer and each shipped
    stage, with the metrics its manifest records), so stages that start from them train without
    retraining the x1 chain. Stages already in `out` are left alone. Returns the stages adopted."""
    manifest = read_manifest(source)
    recorded = manifest.get("metrics", {})
    tokenizer = out / "tokenizer"
    if not (tokenizer / "tokenizer.safetensors").exists():
        tokenizer.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / "tokenizer.safetensors", tokenizer / "tokenizer.safetensors")
        (tokenizer / "metrics.json").write_text(json.dumps(recorded.get("tokenizer", {}), indent=2))
    adopted = []
    for role, stage in SHIPPED.items():
        if finished(out, stage) or f"{role}.safetensors" not in manifest["files"]:
            continue
        (out / stage).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / f"{role}.safetensors", weights_of(out, stage))
        (out / stage / "metrics.json").write_text(json.dumps(recorded.get(stage, {}), indent=2))
        adopted.append(stage)
    return adopted


def install(out: Path, metrics: dict[str, Any], dest: Path = WEIGHTS_DIR, world: str = "x1") -> dict[str, Any]:
    """Copy the trained files of `world` into `dest` and write the manifest (sha256, config,
    losses). Borrowed files (BORROWED) are not copied: the manifest points at the lending world's
    folder beside `dest` and records the sha256 they must keep."""
    dest.mkdir(parents=True, exist_ok=True)
    chosen = WORLD_SHIPPED[world]
    shipped = {role: stage for role, stage in chosen.items() if weights_of(out, stage).exists()}
    files = [f"{role}.safetensors" for role in shipped]
    links = {name: f"../{WORLDS[lender].name}/{lent}" for name, (lender, lent) in BORROWED[world].items()}
    if "tokenizer.safetensors" not in links:
        files.insert(0, "tokenizer.safetensors")
        shutil.copyfile(out / "tokenizer" / "tokenizer.safetensors", dest / "tokenizer.safetensors")
    for role, stage in shipped.items():
        # GPTs ship in fp16 (half the bytes; loading casts back to fp32).
        save_gpt(load_gpt(weights_of(out, stage)), dest / f"{role}.safetensors", metrics.get(stage, {}),
                 dtype=torch.float16)
    info = {"recipe": {"tokenizer": TOKENIZER, "gpts": {s: GPTS[s] for s in WORLD_STAGES[world]},
                       "shipped": chosen},
            "commit": _commit(), "torch": torch.__version__, "metrics": metrics}
    return write_manifest(dest, files, info, links)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="working folder (checkpoints, logs)")
    ap.add_argument("--world", default="x1", choices=list(WORLD_STAGES),
                    help="x1: the 16x16 world (harness/shapes/weights); x2: the 32x32 world (weights_x2)")
    ap.add_argument("--stages", nargs="+", default=None, choices=list(GPTS),
                    help="GPT stages to train, with the stages they start from (default: the world's)")
    ap.add_argument("--from-shipped", action="store_true",
                    help=f"start from the x1 weights shipped in {WEIGHTS_DIR} instead of retraining them")
    ap.add_argument("--install", action="store_true", help="copy the world's weights into the package")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--workers", type=int, default=0,
                    help="processes rendering training batches ahead of the step (about 4 batches/s "
                         "each at 128 px); 0 renders in the training process")
    ap.add_argument("--device", default="cpu",
                    help="where the GPTs train (cuda: 13-23 steps/s per run measured with six runs sharing "
                         "one H200, against 1-4 on 2 CPU cores; the floats differ from the shipped CPU run)")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.from_shipped:
        log.info("adopted the shipped stages %s", adopt_shipped(a.out))
    metrics = {"tokenizer": stage_tokenizer(a.out)}
    for stage in stage_order(a.stages or WORLD_STAGES[a.world], a.out):
        metrics[stage] = stage_gpt(a.out, stage, a.device, a.workers)
    if a.install:
        manifest = install(a.out, metrics, WORLDS[a.world], a.world)
        log.info("installed %d files into %s (%s)", len(manifest["files"]), WORLDS[a.world], MANIFEST)
        stage_eagle_head(a.out, a.world, WORLDS[a.world])


if __name__ == "__main__":
    main()
