"""Progress of long loops, on a terminal and in a batch job's log.

On a terminal a tqdm bar redraws in place. A SLURM job or `nohup` run writes to a file, where tqdm
(with `disable=None`) stays silent, so hours of generation would leave no trace. There `progress`
logs a line at INFO instead, at most once per `interval` seconds and at the end:

    untimed mulo_sd: 3/12 batches (25%), 4.1 min elapsed, about 12.3 min left
"""
from __future__ import annotations

import logging
import sys
import time
from typing import Iterable, Iterator, Sized, TypeVar

from tqdm.auto import tqdm

log = logging.getLogger(__name__)
T = TypeVar("T")

INTERVAL_S = 60.0


def progress(items: Iterable[T], desc: str, unit: str, interval: float = INTERVAL_S,
             interactive: bool | None = None) -> Iterator[T]:
    """Yield `items`, showing progress: a tqdm bar when stderr is a terminal (or `interactive`),
    else a log line every `interval` seconds and one when the loop ends (module docstring)."""
    if interactive is None:
        interactive = sys.stderr.isatty()
    if interactive:
        yield from tqdm(items, desc=desc, unit=unit)
        return
    total = len(items) if isinstance(items, Sized) else None
    start = last = time.monotonic()
    done = 0
    for item in items:
        yield item
        done += 1
        now = time.monotonic()
        if now - last >= interval or done == total:
            log.info("%s", line(desc, unit, done, total, now - start))
            last = now


def line(desc: str, unit: str, done: int, total: int | None, elapsed_s: float) -> str:
    """'desc: done/total unit (pct%), E min elapsed, about R min left' (the remainder at the mean
    pace so far; without a total only the count and the elapsed time)."""
    elapsed = f"{elapsed_s / 60:.1f} min elapsed"
    if not total:
        return f"{desc}: {done} {unit}, {elapsed}"
    left = elapsed_s / done * (total - done) if done else float("nan")
    return (f"{desc}: {done}/{total} {unit} ({100 * done / total:.0f}%), {elapsed}, "
            f"about {left / 60:.1f} min left")
