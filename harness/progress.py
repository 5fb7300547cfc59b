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


class Meter:
    """Progress of `total` units (None: unknown), advanced with `update(n)`: a tqdm bar when stderr
    is a terminal (or `interactive`), else a log line every `interval` seconds and one when the
    count reaches the total (module docstring). `enabled=False` shows nothing. A context manager
    (the bar is closed on exit)."""

    def __init__(self, total: int | None, desc: str, unit: str, interval: float = INTERVAL_S,
                 interactive: bool | None = None, enabled: bool = True) -> None:
        self.total, self.desc, self.unit, self.interval, self.enabled = total, desc, unit, interval, enabled
        self.bar = None
        if enabled and (sys.stderr.isatty() if interactive is None else interactive):
            self.bar = tqdm(total=total, desc=desc, unit=unit)
        self.done = 0
        self.start = self.last = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
            return
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.last >= self.interval or self.done == self.total:
            log.info("%s", line(self.desc, self.unit, self.done, self.total, now - self.start))
            self.last = now

    def __enter__(self) -> "Meter":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()


def progress(items: Iterable[T], desc: str, unit: str, interval: float = INTERVAL_S,
             interactive: bool | None = None, enabled: bool = True) -> Iterator[T]:
    """Yield `items`, showing their progress with a Meter (one unit per item; none if not enabled)."""
    total = len(items) if isinstance(items, Sized) else None
    with Meter(total, desc, unit, interval, interactive, enabled) as meter:
        for item in items:
            yield item
            meter.update()


def line(desc: str, unit: str, done: int, total: int | None, elapsed_s: float) -> str:
    """'desc: done/total unit (pct%), E min elapsed, about R min left' (the remainder at the mean
    pace so far; without a total only the count and the elapsed time)."""
    elapsed = f"{elapsed_s / 60:.1f} min elapsed"
    if not total:
        return f"{desc}: {done} {unit}, {elapsed}"
    left = elapsed_s / done * (total - done) if done else float("nan")
    return (f"{desc}: {done}/{total} {unit} ({100 * done / total:.0f}%), {elapsed}, "
            f"about {left / 60:.1f} min left")
