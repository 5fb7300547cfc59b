"""The time budget of a generate stage, printed once the warm-up has measured what it needs
(harness/generate.py; docs/methodology.md, "The budget").

    budget = sum over decoders of  (warm-up images + timing.reps x timed images) x c(timing batch)
                                   + untimed images x c(batch_size)
             + the seconds the timed images' entries took, computed ahead at batch_size (measured)
             + condition entries computed at the timing batch x k(timing batch)
             + condition entries computed at batch_size x k(batch_size)

c(b) is a decoder's per-image cost (decode + tokens to pixels, and the conditioner's call where the
condition cache does not keep it) measured on a batch of b images of this job: the timed batch in
the warm-up, the batch_size batch on the decoder's first untimed batch. k(b) is the seconds one
condition entry (Tar's LLM sample of an image, LlamaGen's text features of a prompt) took when it was
computed at b. Compile time is measured apart (a decode that compiled graphs is decoded again for
c(b)) and left out, as are PNG writes and the decodes that re-measure after a compile.

The evaluate stage is added beside it, said apart: each planned evaluator's images (every decoder's
whole SampleSet, which the evaluate stage scores, in this job or a later one) x the seconds per image
its config states (`seconds_per_image`, an assumed figure on a GPU, not measured by this job); the
evaluate stage logs what each evaluator took.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence


@dataclass(frozen=True, slots=True)
class Cost:
    """One measured decode: `seconds` for a batch of `batch_size` images, compile excluded; `where`
    it was measured (the warm-up, the first untimed batch)."""

    batch_size: int
    seconds: float
    where: str

    @property
    def per_image(self) -> float:
        return self.seconds / self.batch_size


@dataclass(frozen=True, slots=True)
class Work:
    """One decoder's images in a job: decoded once in the warm-up and `reps` times in the timed pass
    (both at the timing batch), and once in the untimed pass (at batch_size)."""

    decoder: str
    warmup: int
    timed: int
    untimed: int


@dataclass(frozen=True, slots=True)
class Conditioning:
    """Condition entries the job computes at each batch size, and the measured seconds per entry at
    each (None: nothing was computed at that size during the warm-up)."""

    timed: int = 0
    untimed: int = 0
    timed_s: float | None = None
    untimed_s: float | None = None
    ahead: int = 0  # entries of the timed images computed before the warm-up (harness/generate.py)
    ahead_s: float = 0.0  # the seconds they took, measured


@dataclass(frozen=True, slots=True)
class EvaluateCost:
    """An evaluator's share: the `images` it scores x `seconds_per_image` (its config's assumed figure
    on a GPU; None: the config states none)."""

    evaluator: str
    images: int
    seconds_per_image: float | None


@dataclass(frozen=True)
class Budget:
    """The estimate: seconds per decoder and for conditioning, compile seconds measured apart, and
    the evaluate stage's assumed seconds."""

    decode_s: dict[str, float]
    condition_s: float
    compile_s: float
    unit: str
    lines: list[str] = field(default_factory=list)
    evaluate_s: float = 0.0

    @property
    def seconds(self) -> float:
        return sum(self.decode_s.values()) + self.condition_s

    def __str__(self) -> str:
        hours = self.seconds / 3600
        head = (f"budget: about {hours:.3g} {self.unit} for this job's generation (decoding "
                f"{sum(self.decode_s.values()) / 3600:.3g} h, conditioning {self.condition_s / 3600:.3g} h), "
                f"and about {self.evaluate_s / 3600:.3g} GPU-hours to evaluate (assumed per-image costs, below); "
                "compile and PNG writes not included")
        if self.compile_s:
            head += f"; compiling took {self.compile_s:.1f} s in the warm-up, measured apart"
        return "\n".join([head, *(f"  {line}" for line in self.lines)])


def estimate(work: Sequence[Work], costs: Mapping[tuple[str, int], Cost], *, reps: int, timed_size: int,
             batch_size: int, conditioning: Conditioning, compile_s: float = 0.0,
             device: str = "cpu", evaluate: Sequence[EvaluateCost] = ()) -> Budget:
    """The budget of `work` (module docstring) from the per-decoder `costs` measured at each batch
    size ((decoder, batch size) -> Cost). A batch size a decoder was not measured at takes its
    cost at the other one, said so in the lines."""
    decode: dict[str, float] = {}
    lines = []
    for item in work:
        parts = []
        total = 0.0
        for images, size, what in ((item.warmup + reps * item.timed, timed_size, f"{item.warmup} warm-up + "
                                    f"{reps} x {item.timed} timed"),
                                   (item.untimed, batch_size, f"{item.untimed} untimed")):
            if not images:
                continue
            cost = costs.get((item.decoder, size))
            said = ""
            if cost is None:
                cost, said = _other(costs, item.decoder), f"; not measured at batch {size}"
            total += images * cost.per_image
            said = f"measured on a batch of {cost.batch_size}, {cost.where}{said}"
            parts.append(f"{what} images x {cost.per_image:.4g} s ({said})")
        decode[item.decoder] = total
        lines.append(f"{item.decoder}: {'; '.join(parts) or 'nothing to decode'} = {total / 3600:.3g} h")
    condition_s = conditioning.ahead_s
    if conditioning.ahead:
        lines.append(f"conditioning: {conditioning.ahead} entries of the timed images computed ahead in calls of "
                     f"{batch_size}: {conditioning.ahead_s:.4g} s (measured)")
    for entries, rate, other, size in ((conditioning.timed, conditioning.timed_s, conditioning.untimed_s, timed_size),
                                       (conditioning.untimed, conditioning.untimed_s, conditioning.timed_s,
                                        batch_size)):
        if not entries:
            continue
        seconds = rate if rate is not None else other
        said = f"measured at batch {size}" if rate is not None else f"not measured at batch {size}"
        if seconds is None:
            seconds, said = 0.0, "not measured: no entry was computed in the warm-up"
        condition_s += entries * seconds
        lines.append(f"conditioning: {entries} entries to compute at batch {size} x {seconds:.4g} s ({said})")
    evaluate_s = 0.0
    for item in evaluate:
        if item.seconds_per_image is None:
            lines.append(f"evaluate {item.evaluator}: {item.images} images, no per-image cost stated "
                         f"(evaluator.{item.evaluator}.seconds_per_image); left out")
            continue
        evaluate_s += item.images * item.seconds_per_image
        lines.append(f"evaluate {item.evaluator}: {item.images} images x {item.seconds_per_image:.4g} s (assumed on a "
                     f"GPU: evaluator.{item.evaluator}.seconds_per_image) = {item.images * item.seconds_per_image / 3600:.3g} h")
    unit = "GPU-hours" if device.startswith("cuda") else "CPU-hours"
    return Budget(decode, condition_s, compile_s, unit, lines, evaluate_s)


def _other(costs: Mapping[tuple[str, int], Cost], decoder: str) -> Cost:
    """A decoder's cost measured at another batch size."""
    found = [cost for (name, _), cost in costs.items() if name == decoder]
    if not found:
        raise ValueError(f"no decode of {decoder} was measured; the budget needs the warm-up")
    return found[0]
