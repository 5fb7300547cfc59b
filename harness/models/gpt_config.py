"""The architecture of one LlamaGen-style GPT: the config below both the GPT (gpt.py) and its blocks
(transformer.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class GPTConfig:
    """Architecture of one GPT. `grid` is (rows, cols) of image tokens."""

    vocab_size: int
    grid: tuple[int, int]
    dim: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_kv_head: int | None = None
    multiple_of: int = 64
    ffn_dim_multiplier: float | None = None
    norm_eps: float = 1e-5
    rope_base: float = 10000.0
    pos_embed: str = "rope2d"  # "rope2d" (LlamaGen) | "abs_pe" (Tar AR-DTok)
    pos_embed_len: int | None = None  # rows of `abs_pe` (None: prefix_len + n_tokens - 1, as Tar)
    prefix_rope: str = "identity"  # rotary table of the prefix slots: "identity" | "zero" (LlamaGen)
    cond_embed: str = "caption_mlp"  # "caption_mlp" (LlamaGen cls_embedding) | "linear" (Tar clip_proj)
    prefix_len: int = 16  # condition tokens (LlamaGen's cls_token_num)
    caption_dim: int = 64  # width of the condition features fed to cls_embedding
    dropout: float = 0.0
    cond_dropout: float = 0.1  # probability of the unconditional embedding in training (CFG)
    OPTIONS: ClassVar[dict[str, tuple[str, ...]]] = {
        "pos_embed": ("rope2d", "abs_pe"), "prefix_rope": ("identity", "zero"),
        "cond_embed": ("caption_mlp", "linear")}

    def __post_init__(self) -> None:
        for key, options in self.OPTIONS.items():
            if getattr(self, key) not in options:
                raise ValueError(f"{key} must be one of {options}, got {getattr(self, key)!r}")
        if self.dim % self.n_head:
            raise ValueError(f"dim {self.dim} is not divisible by n_head {self.n_head}")

    @property
    def n_tokens(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head
