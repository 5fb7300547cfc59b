"""`model=shapes`: the shipped, trained shapes-world bundle (target 16x16, drafter 8x8, optional
small drafter at 16x16, the target's EAGLE head), one tokenizer and the caption grammar's
conditioner. `model=shapes_x2`: the x2 world (target 32x32 at 128 px, drafter 16x16 at 64 px trained
on from the x1 target, small drafter 32x32, EAGLE head)."""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from harness.api import ModelBundle
from harness.models.conditioners import WordIdConditioner
from harness.models.eagle_head import check_compatible, load_trained
from harness.models.image_model import TokenImageModel
from harness.shapes.captions import ENCODINGS, encoding_of
from harness.shapes.vq import load_tokenizer
from harness.shapes.weights import WORLDS, WeightsError, load_gpt, read_manifest, verified

log = logging.getLogger(__name__)
HEAD_FILE = "eagle_head.safetensors"


def load(weights_dir: str | Path | None = None, drafter: bool = True, small_drafter: bool = True,
         world: str = "x1", eagle_head: bool = True) -> ModelBundle:
    """Load the bundle from `weights_dir` (default: the weights of `world` shipped in the package,
    "x1" or "x2"), checking every file's sha256 against the manifest. `eagle_head`: attach the
    target's EAGLE head (eagle_head.safetensors, trained by python -m baselines.training.train_eagle) when
    the folder has one."""
    if world not in WORLDS:
        raise ValueError(f"shapes world must be one of {sorted(WORLDS)}, got {world!r}")
    folder = Path(weights_dir) if weights_dir else WORLDS[world]
    files = read_manifest(folder)["files"]
    tokenizer = load_tokenizer(verified("tokenizer.safetensors", folder))

    encodings: dict[str, str] = {}

    def model(role: str) -> TokenImageModel:
        gpt = load_gpt(verified(f"{role}.safetensors", folder))
        encodings[role] = encoding_of(gpt.cfg.prefix_len, gpt.cfg.word_vocab)
        return TokenImageModel(gpt, tokenizer, image_size=gpt.cfg.grid[0] * 4)

    target = model("target")
    if eagle_head and HEAD_FILE in files:
        path = verified(HEAD_FILE, folder)
        head = load_trained(path)
        check_compatible(head.cfg, target.gpt.cfg, str(path))
        target.eagle_head = head
    bundle = dict(
        target=target,
        drafter=model("drafter") if drafter and "drafter.safetensors" in files else None,
        small_drafter=model("small_drafter") if small_drafter and "small_drafter.safetensors" in files else None,
    )
    # One conditioner serves every model of the bundle, so all must read the same caption encoding.
    if len(set(encodings.values())) != 1:
        raise WeightsError(f"the shapes models in {folder} read different caption encodings {encodings}; "
                           "retrain them with one recipe")
    tokenize, slots, _ = ENCODINGS[encodings["target"]]
    name = "shapes" if world == "x1" else f"shapes_{world}"
    return ModelBundle(name=name, conditioner=WordIdConditioner(tokenize, slots), **bundle,
                       weights_id="manifest:" + _digest(files))


def _digest(files: dict) -> str:
    """sha256 of the manifest's file table (every file's sha256 and size): the weights' identity."""
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
