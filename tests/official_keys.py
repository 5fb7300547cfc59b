"""Reading the recorded official key/shape fixtures (tests/fixtures/official_keys/*.txt)."""
from __future__ import annotations

from pathlib import Path

from torch import nn

FIXTURES = Path(__file__).parent / "fixtures" / "official_keys"


def recorded(name: str) -> dict[str, tuple[int, ...]]:
    """key -> shape of fixture `name` (comment lines skipped)."""
    out: dict[str, tuple[int, ...]] = {}
    for line in (FIXTURES / name).read_text().splitlines():
        if line and not line.startswith("#"):
            key, shape = line.split("\t")
            out[key] = tuple(int(s) for s in shape.split(","))
    return out


def keys_of(module: nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def diff(ours: dict[str, tuple[int, ...]], official: dict[str, tuple[int, ...]]) -> str:
    """Human-readable difference ('' when equal)."""
    missing = sorted(set(official) - set(ours))
    extra = sorted(set(ours) - set(official))
    shapes = sorted(f"{k}: ours {ours[k]} official {official[k]}" for k in set(ours) & set(official)
                    if ours[k] != official[k])
    if not (missing or extra or shapes):
        return ""
    return f"missing {missing[:10]} extra {extra[:10]} shapes {shapes[:10]}"
