"""How often the timing-noise warning fires on a quiet machine, and whether it fires beside a load.

Runs the default job (`python -m harness`, any overrides after `--`) as a user does, in a fresh
process each time: `--quiet N` runs with the machine to itself, then `--loaded M` runs beside a
competing CPU-bound process (`--load busy`: one Python busy loop; `--load torch`: a torch matmul loop
at two threads). Every run's SampleSets keep each timed batch's repetitions (wall, thread CPU, and
the scheduler's run / run-queue wait times), so the noise statistics are computed here from the same
runs, side by side:

    noise      the harness's `timing_noise` (evaluators/speed.py), as its summary.csv holds it, and
               whether the run warned (against timing.noise_threshold);
    new        timing_noise recomputed from the repetitions by evaluators/speed.py's
               timing_noise_of (0.9 quantile over batches): contention and steal;
    old        the statistic before it (0.9 quantile over batches of the largest of the wall-time
               spread and the steal), for comparison;
    wait       run-queue wait share: waited / (ran + waited) of the process's threads over a
               decoder's timed decodes (the kernel's schedstat; ~0 when nothing competes);
    spread     median over batches of (max - min) / min of a batch's repetitions;
    steal      median over batches of 1 - thread CPU / wall of the decoding thread.

    python benchmarks/timing_noise.py --quiet 5 --loaded 2 --out /tmp/noise
    python benchmarks/timing_noise.py --quiet 1 --loaded 1 --out /tmp/noise -- threads=1

It ends with the false-alarm rate (quiet runs that warned) and the miss rate (loaded runs that did
not), and writes `runs.csv` (one row per run and decoder) under `--out`.
"""
from __future__ import annotations

import argparse
import logging
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python benchmarks/timing_noise.py` from a clone
    sys.path.insert(0, str(ROOT))

from evaluators.speed import timing_noise_of  # noqa: E402

log = logging.getLogger("timing_noise")
LOADS = {
    "busy": "import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass\n",
    "torch": ("import time, torch\ntorch.set_num_threads(2)\na = torch.randn(512, 512)\n"
              "end = time.time() + {seconds}\nwhile time.time() < end: a @ a\n"),
}


def _floats(cell: object) -> list[float]:
    if not isinstance(cell, str) or not cell.strip():
        return []
    return [float(v) for v in cell.split()]


def decoder_figures(stats: pd.DataFrame) -> dict[str, float]:
    """The candidate noise figures of one decoder's stats.csv (timed batches only)."""
    timed = stats[stats["timed"].astype(str).str.lower() == "true"].drop_duplicates("batch_id")
    spreads, steals, ran, waited, new, old = [], [], 0.0, 0.0, [], []
    for _, row in timed.iterrows():
        wall, cpu = _floats(row.get("latency_reps_s")), _floats(row.get("cpu_reps_s"))
        run, wait = _floats(row.get("run_reps_s")), _floats(row.get("wait_reps_s"))
        spread = (max(wall) - min(wall)) / min(wall) if len(wall) >= 2 and min(wall) > 0 else float("nan")
        spreads.append(spread)
        steal = [max(0.0, 1 - c / w) for c, w in zip(cpu, wall)] if cpu and len(cpu) == len(wall) else []
        if steal:
            steals.append(statistics.median(steal))
        old.append(max([spread, *steal]))
        new.append(timing_noise_of(wall, cpu, [], run, wait))
        ran += sum(run)
        waited += sum(wait)
    return {
        "batches": len(timed),
        "new": float(np.nanquantile(new, 0.9)) if new else float("nan"),
        "old": float(np.nanquantile(old, 0.9)) if old else float("nan"),
        "wait": waited / (ran + waited) if ran + waited > 0 else float("nan"),
        "spread": float(np.nanmedian(spreads)) if spreads else float("nan"),
        "steal": float(np.median(steals)) if steals else float("nan"),
    }


def one_run(out: Path, overrides: list[str], load: str | None, python: str) -> list[dict[str, object]]:
    """Run the job once (beside `load` when given) and return one row per decoder."""
    out.mkdir(parents=True, exist_ok=True)
    competitor = None
    if load:
        competitor = subprocess.Popen([python, "-c", LOADS[load].format(seconds=3600)])
        time.sleep(1.0)
    start = time.perf_counter()
    try:
        done = subprocess.run([python, "-m", "harness", f"hydra.run.dir={out}", *overrides], cwd=ROOT,
                              capture_output=True, text=True)
    finally:
        if competitor is not None:
            competitor.kill()
            competitor.wait()
    (out / "job.log").write_text(done.stdout + done.stderr)
    (out / "job_s.txt").write_text(f"{time.perf_counter() - start:.1f}\n")
    if done.returncode != 0:
        raise SystemExit(f"the job failed (exit {done.returncode}); its log: {out / 'job.log'}")
    return read_run(out, load)


def read_run(out: Path, load: str | None) -> list[dict[str, object]]:
    """One row per decoder of the run stored under `out`."""
    wall = float((out / "job_s.txt").read_text()) if (out / "job_s.txt").is_file() else float("nan")
    warned = "timing unreliable for" in (out / "job.log").read_text()
    summary = pd.read_csv(out / "summary.csv")
    noise = summary[summary.metric == "timing_noise"].set_index("decoder")["value"]
    rows = []
    for stats_file in sorted((out / "samples").glob("*/stats.csv")):
        decoder = stats_file.parent.name
        rows.append({"run": out.name, "load": load or "quiet", "decoder": decoder, "job_s": round(wall, 1),
                     "warned": warned, "noise": float(noise.get(decoder, float("nan"))),
                     **decoder_figures(pd.read_csv(stats_file))})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quiet", type=int, default=5, help="runs with the machine to itself")
    ap.add_argument("--loaded", type=int, default=2, help="runs beside a competing process")
    ap.add_argument("--load", choices=sorted(LOADS), default="busy", help="the competing process")
    ap.add_argument("--out", type=Path, required=True, help="folder of the runs (one sub-folder each)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter that runs the jobs")
    ap.add_argument("--threshold", type=float, default=0.1, help="timing.noise_threshold the rates are read at")
    ap.add_argument("--reuse", action="store_true", help="read runs already under --out instead of running them")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of every run (after --)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows: list[dict[str, object]] = []
    plan = [(f"quiet{i}", None) for i in range(args.quiet)] + [(f"loaded{i}", args.load) for i in range(args.loaded)]
    for name, load in plan:
        log.info("run %s (%s) ...", name, load or "quiet")
        rows += (read_run(args.out / name, load) if args.reuse else one_run(args.out / name, args.overrides, load,
                                                                           args.python))
        log.info("%s", pd.DataFrame(rows[-6:]).to_string(index=False, float_format="%.3f"))
    table = pd.DataFrame(rows)
    table.to_csv(args.out / "runs.csv", index=False)
    print(table.to_string(index=False, float_format="%.3f"))
    per_run = table.groupby(["run", "load"], sort=False).agg(
        warned=("warned", "first"), new=("new", "max"), old=("old", "max")).reset_index()
    quiet, loaded = per_run[per_run.load == "quiet"], per_run[per_run.load != "quiet"]
    for label, column in (("as run", None), ("new statistic", "new"), ("old statistic", "old")):
        warned = (lambda f: f.warned) if column is None else (lambda f, c=column: f[c] > args.threshold)
        if len(quiet):
            print(f"{label}: false alarms {int(warned(quiet).sum())} of {len(quiet)} quiet runs")
        if len(loaded):
            print(f"{label}: misses {int((~warned(loaded)).sum())} of {len(loaded)} loaded runs")
    print(f"job wall time: quiet median {table[table.load == 'quiet'].groupby('run').job_s.first().median():.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
