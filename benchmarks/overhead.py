"""Harness overhead: raster decoding through the harness against a bare loop of model forwards on
the same model, both timed by the pipeline in one run (harness.run.run: interleaved repetitions):
the bare loop is a decoder here (`BareLoop`), so there is one timer.

    python benchmarks/overhead.py [--model random|shapes] [--batch 1] [--images 8] [--reps 3]
                                  [--cfg 1.0] [--threads N] [--out DIR]

Per decoder: images/s of the decode stage (batch / median decode latency), its time relative to
the bare loop (bare's speed-up over raster, with its interval, gives RasterDecoder / bare), and the
end-to-end latency (condition + decode + tokens to pixels, the speed evaluator's end_to_end_s).
Writing PNGs into the SampleSet is not timed. Both decoders make the same images (one cached
forward per token, the same per-image random streams and sampler); the script checks it.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import compose_config, header, out_dir, quiet, run_job, value  # noqa: E402
from harness.api import Condition, DecodeStats, Generation, ModelBundle, SamplingParams  # noqa: E402
from harness.runtime.sampling import sample  # noqa: E402
from harness.runtime.randomness import ImageStreams  # noqa: E402


class BareLoop:
    """The minimum any raster decoder must do, as a decoder: prefill, then one cached forward per
    token and sampling; no recorder, no rejection map."""

    def __init__(self, sampling: SamplingParams) -> None:
        self.sampling = sampling

    @torch.inference_mode()
    def generate(self, models: ModelBundle, cond: Condition, seeds: Sequence[int]) -> Generation:
        """tokens [B, rows * cols] in raster order."""
        model = models.target
        n = model.grid[0] * model.grid[1]
        streams = ImageStreams(list(seeds), model.device)
        model.setup_cache(len(seeds))
        logits = model.prefill(cond)
        tokens = []
        for i in range(n):
            tokens.append(sample(logits, self.sampling, streams))
            if i + 1 < n:
                logits = model.forward(tokens[-1][:, None], torch.tensor([i], device=model.device))[:, 0]
        stats = [DecodeStats(target_forwards=n, tokens=n) for _ in seeds]
        return Generation(tokens=torch.stack(tokens, 1), stats=stats)


def main(argv: Sequence[str] | None = None) -> Any:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["random", "shapes"], default="random")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cfg", type=float, default=1.0, help="classifier-free guidance scale")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    quiet()
    out = out_dir(a.out, "overhead")
    cfg = compose_config(["decoder=[raster]", "+decoder.bare._target_=benchmarks.overhead.BareLoop",
                          "+decoder.bare.sampling=${sampling}", "name=overhead", "evaluator=[speed]",
                          f"batch_size={a.batch}", f"dataset_limit={a.images}", f"timing.reps={a.reps}",
                          "timing.images=null", "timing.batch_size=null",
                          "sampling.temperature=1.0", "sampling.top_k=null", "sampling.top_p=1.0",
                          f"sampling.cfg_scale={a.cfg}", *([f"threads={a.threads}"] if a.threads else [])], a.model)
    summary = run_job(cfg, out)
    print(header(model=a.model, batch=a.batch, images=a.images, reps=a.reps, threads=torch.get_num_threads(),
                 out=out))
    print(f"{'path':<26} {'img/s':>8} {'time/bare':>22} {'end-to-end s':>13}")
    for name, label in (("bare", "bare loop"), ("raster", "RasterDecoder")):
        ratio = [value(summary, "bare", "speedup_vs_raster", c) for c in ("value", "ci_low", "ci_high")]
        relative = "1.000" if name == "bare" else f"{ratio[0]:.3f} [{ratio[1]:.3f}, {ratio[2]:.3f}]"
        print(f"{label:<26} {a.batch / value(summary, name, 'latency_s'):8.2f} {relative:>22} "
              f"{value(summary, name, 'end_to_end_s'):13.4f}")
    same = all((out / "samples" / "bare" / "images" / p.name).read_bytes() == p.read_bytes()
               for p in (out / "samples" / "raster" / "images").glob("*.png"))
    print("images: " + ("the same" if same else "DIFFERENT (the bare loop is not raster decoding)"))
    return summary


if __name__ == "__main__":
    main()
