"""The GPU-hour table of the paper's main table (`+experiment=paper_main`, docs/methodology.md, "What
the paper's tables cost"): the budget's formula (harness/budget.py) applied to assumed costs, every
line of the estimate printed.

    python benchmarks/gpu_hours.py            # each job's lines, then the table and the total
    python benchmarks/gpu_hours.py --before   # the same under the per-row LLM (one generate per image,
                                              # no entry shared across resolutions)

No GPU figure has been measured yet: the costs below are assumptions, to be replaced by the budgets
the jobs print once measured. Per decoder and job (harness/budget.py):

    (warm-up images + reps x timed images) x c(1) + untimed images x c(batch_size)

plus the condition entries the job computes x their cost. c(b): raster 15 s per image at batch 1
and 1.5 s at batch 16 at 512 px (60 s and 6 s at 1024 px), every accelerated decoder half of
raster's. Conditioning: FLAN-T5 0.05 s per prompt; Tar's LLM 17 s (1.5B) or 25 s (7B) per image
decoded alone, and a 16-row batched `generate` costing LLM_BATCH_COST times a 1-row one (the decode
is memory-bound: a step reads the weights once for all rows; at ~800 positions the 16 rows' KV
cache adds about 12 % (1.5B) / 5 % (7B) to the bytes a step reads; the rest is margin for the
per-row sampler and padding). Entries are shared through one `conditions_dir` (README, step 2):
the 1024 px model reads the 512 px model's LLM entries and `latency` (the first 100 COCO captions)
reads `coco5k`'s, so those jobs compute none. One timing set per job (a sharded job times in
shard 0 alone: docs/slurm.md).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

RASTER_S = {512: (15.0, 1.5), 1024: (60.0, 6.0)}  # px -> (s per image at batch 1, at batch 16)
ACCELERATED = 0.5  # an accelerated decoder's cost, as a share of raster's
FLAN_T5_S = 0.05  # s per prompt
LLM_S = {"tar_1.5b": 17.0, "tar_7b": 25.0}  # s per image, one 729-code generate at batch 1
LLM_BATCH = 16  # model.llm.batch_size
LLM_BATCH_COST = 1.6  # a LLM_BATCH-row generate / a 1-row one
TIMING_REPS = 2  # timing.reps
TARGET_H = 160.0


@dataclass(frozen=True)
class Protocol:
    """A protocol's plan (conf/protocol/*.yaml, conf/dataset/*.yaml)."""

    prompts: int
    images_per_prompt: int
    batch_size: int
    warmup_batches: int
    timed: int | None  # timing.images (null: every image)

    @property
    def images(self) -> int:
        return self.prompts * self.images_per_prompt


@dataclass(frozen=True)
class Model:
    """A model of the paper's table: its size, its runnable decoders (rows_by_model without the rows
    it cannot run) and its conditioner stage (models naming the same stage share its entries)."""

    px: int
    decoders: tuple[str, ...]
    stage: str


PROTOCOLS = {"geneval": Protocol(553, 4, 16, 1, 16), "dpg_bench": Protocol(1065, 4, 16, 1, 16),
             "coco5k": Protocol(5000, 1, 16, 1, 16), "latency": Protocol(100, 1, 1, 3, None)}
PROMPTS_FROM = {"latency": "coco5k"}  # a protocol whose prompts (and image seeds) are another's first ones
MODELS = {"llamagen_xl_512": Model(512, ("raster", "eagle2", "lantern", "mulo_sd"), "flan_t5"),
          "tar_1.5b_512": Model(512, ("raster", "zipar", "mulo_sd"), "tar_1.5b"),
          "tar_7b_512": Model(512, ("raster", "mulo_sd"), "tar_7b"),
          "tar_1.5b_1024": Model(1024, ("raster", "zipar", "mulo_sd"), "tar_1.5b"),
          "tar_7b_1024": Model(1024, ("raster", "mulo_sd"), "tar_7b")}


@dataclass(frozen=True)
class Job:
    """One generate job's estimate: decode and conditioning seconds, with the lines that give them."""

    decode_s: float
    condition_s: float
    lines: tuple[str, ...]

    @property
    def hours(self) -> float:
        return (self.decode_s + self.condition_s) / 3600


def decoder_seconds(model: Model, protocol: Protocol, decoder: str) -> tuple[float, str]:
    """One decoder's decode seconds in a job and the line that computes them."""
    share = 1.0 if decoder == "raster" else ACCELERATED
    c1, c16 = (share * c for c in RASTER_S[model.px])
    c_batch = c1 if protocol.batch_size == 1 else c16
    timed = protocol.images if protocol.timed is None else protocol.timed
    first = protocol.warmup_batches + TIMING_REPS * timed  # at the timing batch, 1
    rest = protocol.images - timed
    seconds = first * c1 + rest * c_batch
    return seconds, (f"{decoder}: ({protocol.warmup_batches} warm-up + {TIMING_REPS} x {timed} timed) x {c1:g} s"
                     f" + {rest} untimed x {c_batch:g} s = {seconds / 3600:.2f} h")


def entry_seconds(stage: str, before: bool) -> float:
    """Seconds per condition entry: a FLAN-T5 prompt, a Tar LLM image (alone, or in a batched call)."""
    if stage == "flan_t5":
        return FLAN_T5_S
    return LLM_S[stage] if before else LLM_S[stage] * LLM_BATCH_COST / LLM_BATCH


def job(name: str, protocol_name: str, computed: set[tuple[str, str]], before: bool = False) -> Job:
    """The estimate of model `name` under `protocol_name`; `computed` holds the (stage, prompt set)
    entries earlier jobs left in the shared conditions_dir (updated; unused with `before`)."""
    model, protocol = MODELS[name], PROTOCOLS[protocol_name]
    lines, decode = [], 0.0
    for decoder in model.decoders:
        seconds, line = decoder_seconds(model, protocol, decoder)
        decode += seconds
        lines.append(line)
    per_prompt = model.stage == "flan_t5"
    entries = protocol.prompts if per_prompt else protocol.images
    source = PROMPTS_FROM.get(protocol_name, protocol_name)
    shared = not before and (model.stage, source) in computed
    cost = entry_seconds(model.stage, before)
    condition = 0.0 if shared else entries * cost
    what = "prompts" if per_prompt else "images"
    lines.append(f"{model.stage}: " + (f"0 (its entries are in conditions_dir: {source}, computed before)" if shared
                                         else f"{entries} {what} x {cost:.3g} s = {condition / 3600:.2f} h"))
    if not before:
        computed.add((model.stage, protocol_name))
    return Job(decode, condition, tuple(lines))


def estimate(before: bool = False) -> dict[str, dict[str, Job]]:
    """Every job of the paper's table, in the order they run (models as listed, protocols as listed)."""
    computed: set[tuple[str, str]] = set()
    return {name: {p: job(name, p, computed, before) for p in PROTOCOLS} for name in MODELS}


def table(jobs: dict[str, dict[str, Job]]) -> str:
    """The documented markdown table: hours per job, the conditioner's share in brackets (Tar)."""
    lines = ["| model | " + " | ".join(f"`{p}`" for p in PROTOCOLS) + " | all |",
             "|---|" + "---:|" * (len(PROTOCOLS) + 1)]
    for name, row in jobs.items():
        cells = []
        for one in row.values():
            cell = f"{one.hours:.1f}"
            if MODELS[name].stage != "flan_t5":
                cell += f" ({one.condition_s / 3600:.1f})"
            cells.append(cell)
        lines.append(f"| `{name}` | " + " | ".join(cells) + f" | {sum(j.hours for j in row.values()):.1f} |")
    return "\n".join(lines)


def total(jobs: dict[str, dict[str, Job]]) -> float:
    return sum(one.hours for row in jobs.values() for one in row.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", action="store_true", help="the per-row LLM, nothing shared")
    args = parser.parse_args(argv)
    jobs = estimate(before=args.before)
    for name, row in jobs.items():
        for protocol, one in row.items():
            sys.stdout.write(f"{name} {protocol}: {one.hours:.2f} GPU-h\n")
            sys.stdout.writelines(f"  {line}\n" for line in one.lines)
    llm = sum(one.condition_s for row in jobs.values() for one in row.values()) / 3600
    sys.stdout.write(f"\n{table(jobs)}\n\ntotal {total(jobs):.1f} GPU-h (conditioning {llm:.1f}); "
                     f"target {TARGET_H:g}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
