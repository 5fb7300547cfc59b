"""How much image detail an up-sampled draft can carry on the shapes worlds, whatever the drafter:
GenEval (geneval_shapes) and FID/KID (fid_shapes) of ground-truth scenes for the prompts and image
seeds of a run's SampleSet, drawn four ways:

- `truth`: rendered at the target's image size: the metrics' floor at this N;
- `truth_tokenized`: the same through the target's tokenizer (encode, decode): the floor of any
  decoder that draws the target's tokens, raster included;
- `truth_low`: rendered at the drafter's image size and resized to the target's (bicubic): what
  the low-resolution scene itself costs;
- `truth_low_drafted`: rendered at the drafter's size, through the drafter's tokenizer, resized
  (bicubic) and through the target's tokenizer: the pixel up-sampler's draft of a perfect drafter,
  i.e. what MuLo-SD verifies when its drafter draws the scene exactly.

The layouts are drawn with their own seed offset, apart from the metric's reference renders, as a
model's would be. Untimed; no model is run besides the tokenizers.

    python benchmarks/draft_ceiling.py --samples RUN/samples/raster [--prompts N] [--model shapes_x2]
                                       [--out DIR] [--threads N]

--samples is any complete SampleSet of a shapes run (its prompts, image seeds and image size are
used; its images are not read; --prompts N keeps its first N samples). Each ceiling is written as
a SampleSet under <out>/samples/<row> and scored there, so its figures compare with that run's rows
at the same N and seed.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from baselines.methods.upsamplers import resize_images  # noqa: E402
from benchmarks.common import compose_config, out_dir, quiet  # noqa: E402
from evaluators.fid_reference import ground_truth  # noqa: E402
from harness.api import ModelBundle, Prompt  # noqa: E402
from harness.run import _build  # noqa: E402
from harness.store.samples import SampleSet, SampleSpec  # noqa: E402
from harness.shapes.bundle import load  # noqa: E402

log = logging.getLogger("benchmarks")
ROWS = ("truth", "truth_tokenized", "truth_low", "truth_low_drafted")
SEED_OFFSET = 7  # ground-truth layouts of these rows; fid_shapes' reference uses offset 1
WORLDS = {"shapes": "x1", "shapes_x2": "x2"}
BATCH = 64


def scenes(records: pd.DataFrame, size: int) -> torch.Tensor:
    """records (meta, seed) -> uint8 [B, 3, size, size]: each prompt's scene, drawn at SEED_OFFSET."""
    images = [ground_truth(json.loads(m), int(s), SEED_OFFSET, size)
              for m, s in zip(records["meta"], records["seed"])]  # meta: the record's JSON string
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous()


def tokenized(model: Any, images: torch.Tensor) -> torch.Tensor:
    """uint8 [B, 3, H, W] -> uint8 [B, 3, H, W]: through the model's tokenizer (encode, decode)."""
    return model.decode(model.encode(images))


def ceiling(row: str, bundle: ModelBundle) -> Callable[[pd.DataFrame], torch.Tensor]:
    """The images of one row for a batch of records: uint8 [B, 3, H, W] at the target's size."""
    high, low = bundle.target.image_size, bundle.drafter.image_size
    up = lambda x: resize_images(x, (high, high), "bicubic")  # noqa: E731
    return {
        "truth": lambda r: scenes(r, high),
        "truth_tokenized": lambda r: tokenized(bundle.target, scenes(r, high)),
        "truth_low": lambda r: up(scenes(r, low)),
        "truth_low_drafted": lambda r: tokenized(bundle.target,
                                                 up(tokenized(bundle.drafter, scenes(r, low)))),
    }[row]


def write_row(root: Path, row: str, records: pd.DataFrame, bundle: ModelBundle) -> SampleSet:
    """The row's images as a SampleSet under root/row (complete samples are kept: reruns resume)."""
    samples = SampleSet(root / row)
    samples.bind({"ceiling": row, "seed_offset": SEED_OFFSET, "model": bundle.name, "format": 1})
    specs = [SampleSpec(sample_id=r.sample_id, image_index=int(r.image_index), seed=int(r.seed),
                        prompt=Prompt(id=r.prompt_id, text=r.prompt, meta=json.loads(r.meta)))
             for r in records.itertuples()]
    todo = {s.sample_id for s in samples.pending(specs)}
    draw, by_id = ceiling(row, bundle), records.set_index("sample_id")
    for start in range(0, len(specs), BATCH):
        batch = [s for s in specs[start:start + BATCH] if s.sample_id in todo]
        if not batch:
            continue
        images = draw(by_id.loc[[s.sample_id for s in batch]]).permute(0, 2, 3, 1).numpy()
        for spec, image in zip(batch, images):
            samples.write(spec, np.ascontiguousarray(image), {"decoder": row})
    samples.consolidate()
    return samples


def evaluators(model: str) -> list[Any]:
    """geneval_shapes and fid_shapes as the harness configures them (without progress bars)."""
    names = ("geneval_shapes", "fid_shapes")
    cfg = compose_config(["dataset=shapes", f"evaluator=[{','.join(names)}]",
                          *(f"evaluator.{n}.show_progress=false" for n in names)], model)
    return [_build(cfg.evaluator[n], drop=()) for n in names]


def score(samples: SampleSet, judges: Sequence[Any]) -> dict[str, float]:
    """GenEval, FID, KID and KID's standard error of one SampleSet."""
    out: dict[str, float] = {}
    for judge in judges:
        frame = judge.evaluate(samples).summary
        for metric in ("geneval", "fid", "kid"):
            hit = frame[(frame.metric == metric) & (frame.subset == "all")]
            if len(hit):
                out[metric] = float(hit.value.iloc[0])
                if metric == "kid":
                    out["kid_se"] = float(hit.stderr.iloc[0])
    return out


def main(argv: Sequence[str] | None = None) -> pd.DataFrame:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=Path, required=True, help="a complete SampleSet of a shapes run")
    ap.add_argument("--prompts", type=int, default=None, help="only the first N samples (sample_id order)")
    ap.add_argument("--model", choices=sorted(WORLDS), default="shapes_x2")
    ap.add_argument("--out", type=Path, default=None,
                    help="folder (default: results/benchmarks/draft_ceiling/<time>)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    a = ap.parse_args(argv)
    quiet()
    if a.threads:
        torch.set_num_threads(a.threads)
    template = SampleSet(a.samples)
    records = template.records().sort_values("sample_id").head(a.prompts).reset_index(drop=True)
    if records.empty:
        ap.error(f"--samples {a.samples} holds no complete samples; give the SampleSet folder of a shapes "
                 f"run (e.g. <run>/samples/raster)")
    bundle = load(world=WORLDS[a.model])
    size = template.load_image(records.sample_id.iloc[0]).shape[0]
    if size != bundle.target.image_size:
        ap.error(f"--samples {a.samples} holds {size} px images, but --model {a.model}'s target draws "
                 f"{bundle.target.image_size} px: give a SampleSet of that world")
    out = out_dir(a.out, "draft_ceiling")
    judges = evaluators(a.model)
    table = []
    for row in ROWS:
        samples = write_row(out / "samples", row, records, bundle)
        table.append({"row": row, "images": len(records), **score(samples, judges)})
        log.info("draft_ceiling: %s done", row)
    frame = pd.DataFrame(table)
    frame.to_csv(out / "ceiling.csv", index=False)
    print(frame.to_markdown(index=False, floatfmt=".4g"), flush=True)
    return frame


if __name__ == "__main__":
    main()
