"""Attribute forwarding, written once: `forwarded("tokenizer.codebook")` is a read-only attribute
that reads a dotted path from the instance, and `ModelWrapper` is an ARImageModel around another
one that keeps everything of it but what a subclass replaces (guidance.py, replay.py)."""
from __future__ import annotations

from typing import Any

from harness.api import ARImageModel


class forwarded:  # noqa: N801 (used like `property`)
    """A read-only attribute: `codebook = forwarded("model.codebook")` reads `self.model.codebook`
    (a method path gives the bound method)."""

    def __init__(self, path: str) -> None:
        self.path = path.split(".")

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        for part in self.path:
            obj = getattr(obj, part)
        return obj

    def __set__(self, obj: Any, value: Any) -> None:
        raise AttributeError(f"{self.name} is read from {'.'.join(self.path)}; it cannot be set")


class ModelWrapper:
    """The part of an ARImageModel around `model` that is the model's: grid, vocabulary, codebook,
    cache length, device, decode and encode, and what draft trees read of it: its raw codebook and
    its EAGLE head (None when it has none) and its input token embedding (GSD). Subclasses define setup_cache, prefill and forward."""

    codebook = forwarded("model.codebook")
    cache_len = forwarded("model.cache_len")
    device = forwarded("model.device")
    decode = forwarded("model.decode")
    encode = forwarded("model.encode")

    def __init__(self, model: ARImageModel) -> None:
        self.model = model
        self.grid = tuple(model.grid)
        self.vocab_size = int(model.vocab_size)

    @property
    def raw_codebook(self) -> Any:
        return getattr(self.model, "raw_codebook", None)

    @property
    def token_embeddings(self) -> Any:
        """The model's input token embedding [V, dim], or None when it exposes none."""
        return getattr(self.model, "token_embeddings", None)

    @property
    def eagle_head(self) -> Any:
        return getattr(self.model, "eagle_head", None)
