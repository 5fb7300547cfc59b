"""Contracts shared by every package: prompts, sampling parameters, conditions, models, decoders,
decode statistics and evaluator results.

Everything the three packages exchange is defined here; `harness` reaches `baselines` and
`evaluators` only through Hydra `_target_` strings.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence, runtime_checkable

import pandas as pd
import torch
from torch import Tensor

METRIC_COLUMNS = ("metric", "subset", "value", "stderr", "n", "higher_is_better")
# Optional summary columns beside METRIC_COLUMNS: a confidence interval of `value` (NaN where none;
# speedup_vs_raster has one, harness/run.py).
INTERVAL_COLUMNS = ("ci_low", "ci_high")
# Optional run column of summary rows: the decoder's setting where it differs from the paper's, e.g.
# "k=32, δ=0.4, on_reject=pooled" (harness/comparisons.decoder_setting); absent or empty at the paper's.
SETTING_COLUMN = "setting"


@dataclass(frozen=True, slots=True, kw_only=True)
class Prompt:
    """One benchmark prompt. `id` is stable across runs (e.g. "geneval/00042")."""

    id: str
    text: str
    meta: dict[str, Any] = field(default_factory=dict)


class InputError(Exception):
    """A problem the user can fix (a config value, a file, a folder). Its message names the field or
    file and the fix; `python -m harness` prints it without a traceback and exits with status 2.
    Concrete errors subclass it together with the built-in type they are (ValueError, OSError)."""


# Informational keys of model and decoder config nodes, never passed to the target and not part of
# what a SampleSet is bound to (no image depends on them): `requires`, `provides`, `lacks`,
# `needs_metadata` (read by harness/preflight.py), `paper_setting` (a decoder's paper values of the
# keys a world may move), `operating_points` (a model's settings of decoders on its world, read by
# the decoders' configs), `paper_precision` (a model's published precision keys:
# harness/comparisons.model_setting), `gpu` and `seconds_per_image` (an evaluator's, read by the
# evaluate guard and the budget).
INFO_KEYS = ("requires", "provides", "lacks", "needs_metadata", "paper_setting", "operating_points",
             "paper_precision", "gpu", "seconds_per_image")


class ConfigValueError(InputError, ValueError):
    """A config value of the wrong type or out of range."""


def checked_number(field: str, value: Any, *, integer: bool = False, low: float | None = None,
                   low_open: bool = False, high: float | None = None) -> Any:
    """`value` if it is a finite number (an int when `integer`) within [low, high] (low excluded when
    `low_open`), else ConfigValueError naming `field`. Booleans and numeric strings are refused."""
    kind = "an integer" if integer else "a number"
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type:
        raise ConfigValueError(f"{field} must be {kind}, got {value!r} ({type(value).__name__})")
    if not math.isfinite(value):
        raise ConfigValueError(f"{field} must be a finite number, got {value!r}")
    below = low is not None and (value <= low if low_open else value < low)
    if below or (high is not None and value > high):
        lo = "" if low is None else f"{'>' if low_open else '>='} {low}"
        hi = "" if high is None else f"<= {high}"
        raise ConfigValueError(f"{field} must be {' and '.join(b for b in (lo, hi) if b)}, got {value!r}")
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingParams:
    """How logits become a distribution. p is always: CFG-mixed logits -> temperature -> top-k ->
    top-p (`filter_order: top_k_first`, LlamaGen's order) or -> temperature -> top-p -> top-k
    (`top_p_first`, LANTERN's `prepare_logits_processor`); the two differ only when both filters are
    set. `temperature == 0` means greedy (argmax). Every field is checked at construction: finite,
    of the right type, in range."""

    FILTER_ORDERS = ("top_k_first", "top_p_first")

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0
    cfg_scale: float = 1.0
    filter_order: str = "top_k_first"

    def __post_init__(self) -> None:
        checked_number("sampling.temperature", self.temperature, low=0)  # 0 = greedy
        checked_number("sampling.top_p", self.top_p, low=0, low_open=True, high=1)
        if self.top_k is not None:
            checked_number("sampling.top_k", self.top_k, integer=True, low=1)  # null = no top-k
        checked_number("sampling.cfg_scale", self.cfg_scale, low=0)
        if self.filter_order not in self.FILTER_ORDERS:
            raise ConfigValueError(f"sampling.filter_order must be one of {list(self.FILTER_ORDERS)}, got "
                                   f"{self.filter_order!r}; e.g. sampling.filter_order=top_k_first")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


Box = tuple[float, float, float, float]


@dataclass
class Detection:
    """One detected object, the contract between GenEval's detector backends and its rules. `box` =
    (x1, y1, x2, y2) in pixels; `mask` bool [H, W] or None; `color` one of GenEval's colour names
    (filled by the detector or a colour classifier) or None."""

    cls: str
    box: Box
    score: float
    mask: Any = None  # np.ndarray [H, W] bool
    color: str | None = None


@runtime_checkable
class Condition(Protocol):
    """Opaque, batched text condition produced by `ModelBundle.condition` and consumed by the
    `prefill` of every model of the same bundle (target and drafters share it)."""

    @property
    def batch_size(self) -> int: ...

    def with_null(self) -> "Condition":
        """[B] -> [2B]: the conditional rows followed by the same rows made unconditional (CFG)."""
        ...

    def select(self, index: Tensor) -> "Condition":
        """Rows `index` [B'] of the batch."""
        ...


@runtime_checkable
class ARImageModel(Protocol):
    """An autoregressive model over a `rows x cols` grid of codebook tokens in raster order, with a
    static, position-indexed KV cache.

    Image position `i` (0 <= i < rows*cols) is the raster index of a token. `forward` writes the
    keys/values of `tokens` at `positions` and returns, for each input, the logits of the token at
    raster position `position + 1`; `prefill` returns the logits of position 0. Rollback is an
    overwrite: re-running `forward` at a position replaces its cache entry. With `mask=None` a query
    at position i sees the prefix and every cache entry at positions <= i (whatever they hold);
    an explicit boolean `mask` [B, T, S] (S = `cache_len`, True = attend) overrides that.
    """

    grid: tuple[int, int]
    vocab_size: int

    @property
    def codebook(self) -> Tensor:
        """Codebook embedding vectors [V, D] of the tokenizer (for neighbour tables)."""
        ...

    @property
    def cache_len(self) -> int:
        """Number of cache slots S = prefix length + rows*cols."""
        ...

    def setup_cache(self, batch_size: int) -> None: ...

    def prefill(self, cond: Condition) -> Tensor:
        """Write the condition prefix into the cache; return logits [B, V] for position 0."""
        ...

    def forward(self, tokens: Tensor, positions: Tensor, mask: Tensor | None = None) -> Tensor:
        """tokens [B, T] at image positions [T] or [B, T] -> logits [B, T, V] for positions + 1."""
        ...

    def decode(self, tokens: Tensor) -> Tensor:
        """tokens [B, rows*cols] int64 -> images [B, 3, H, W] uint8."""
        ...

    def encode(self, images: Tensor) -> Tensor:
        """images [B, 3, H, W] uint8 -> tokens [B, rows*cols] int64 at this model's grid."""
        ...


@dataclass(slots=True, kw_only=True)
class ModelBundle:
    """What a `model=` config instantiates: the target, optional drafters, and the conditioner.

    `drafter` is the same-family model at lower resolution (MuLo-SD); `small_drafter` is a small
    model at the target's resolution (draft-model SD and the chain LANTERN, `lantern_chain`);
    `eagle_head` (read from the target) is EAGLE-2's and LANTERN's drafter."""

    name: str
    target: ARImageModel
    conditioner: Any  # callable: Sequence[str] -> Condition
    drafter: ARImageModel | None = None
    small_drafter: ARImageModel | None = None
    weights_id: str | None = None  # identifies the weights (e.g. a manifest digest); None: the
                                   # harness digests the models' parameters when it needs an id

    def condition(self, prompts: Sequence[str], seeds: Sequence[int] | None = None) -> Condition:
        """The condition of one image per prompt; `seeds` (the images' seeds) reach a conditioner
        that draws per image (`takes_seeds`: Tar's LLM stage), the others read only the prompts."""
        if seeds is not None and getattr(self.conditioner, "takes_seeds", False):
            return self.conditioner(prompts, seeds)
        return self.conditioner(prompts)

    @property
    def eagle_head(self) -> Any:
        """The EAGLE head drafting on the target's features (EAGLE-2, LANTERN), or None. It lives on
        the target model (`target.eagle_head`, harness/models/eagle_head.py), so a bundle whose
        target is wrapped (guidance) keeps it."""
        return getattr(self.target, "eagle_head", None)

    def to(self, device: torch.device | str) -> "ModelBundle":
        for m in (self.target, self.drafter, self.small_drafter, self.conditioner):
            if m is not None and hasattr(m, "to"):
                m.to(device)
        return self


@dataclass(slots=True, kw_only=True)
class DecodeStats:
    """Per-image decoding statistics. Counters are per image (a batched forward counts once for
    every image in the batch)."""

    target_forwards: int = 0
    drafter_forwards: int = 0
    tokens: int = 0
    proposed: int = 0
    accepted: int = 0
    resampled: int = 0
    accepted_per_step: list[int] = field(default_factory=list)
    rejection_map: Tensor | None = None  # [rows, cols] int64: rejections per position
    extra: dict[str, float] = field(default_factory=dict)
    # per-image columns beyond the counters, already CSV-safe (str or int): MuLo-SD's redraw record
    # (baselines/framework/redraw.py: first_rejection, redraw_map, draft_tokens, tau_*)
    columns: dict[str, str | int] = field(default_factory=dict)

    def as_row(self) -> dict[str, Any]:
        """Flat scalar columns for stats.csv (the histogram is written as a space-separated list)."""
        row: dict[str, Any] = {
            "target_forwards": self.target_forwards,
            "drafter_forwards": self.drafter_forwards,
            "tokens": self.tokens,
            "proposed": self.proposed,
            "accepted": self.accepted,
            "resampled": self.resampled,
            "accepted_per_step": " ".join(map(str, self.accepted_per_step)),
            "rejection_map": (
                "" if self.rejection_map is None
                else " ".join(map(str, self.rejection_map.flatten().tolist()))
            ),
        }
        row.update(self.extra)
        row.update(self.columns)
        return row


def int_list(value: object) -> list[int]:
    """Parse a space-separated integer list as DecodeStats.as_row() writes it (CSV-safe): the inverse
    of its list columns."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return []
    if isinstance(value, (int, float)) or hasattr(value, "__index__"):  # a one-item list read from CSV
        return [int(value)]
    return [int(token) for token in str(value).split()]


@dataclass(frozen=True, slots=True, kw_only=True)
class Generation:
    """A decoder's output for one batch: tokens [B, N] in raster order and one stats per image."""

    tokens: Tensor
    stats: list[DecodeStats]


class Decoder(Protocol):
    """Pure function of (models, condition, sampling, per-image seeds); never times, prints or
    touches global RNG."""

    name: str

    def generate(self, models: ModelBundle, cond: Condition, seeds: Sequence[int]) -> Generation: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalResult:
    """`summary` has METRIC_COLUMNS, one row per (metric, subset); `per_sample` has sample_id."""

    summary: pd.DataFrame
    per_sample: pd.DataFrame | None = None

    def __post_init__(self) -> None:
        missing = [c for c in METRIC_COLUMNS if c not in self.summary.columns]
        if missing:
            raise ValueError(f"EvalResult.summary lacks columns {missing}")


class Evaluator(Protocol):
    name: str
    version: str

    def evaluate(self, samples: Any) -> EvalResult:  # samples: harness.store.samples.SampleSet
        ...


def metric_rows(rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """Build a summary frame from dicts with (a subset of) METRIC_COLUMNS; fills defaults."""
    frame = pd.DataFrame(list(rows))
    defaults = {"subset": "all", "stderr": float("nan"), "n": 0, "higher_is_better": True}
    for col, val in defaults.items():
        if col not in frame.columns:
            frame[col] = val
    return frame[list(METRIC_COLUMNS)]
