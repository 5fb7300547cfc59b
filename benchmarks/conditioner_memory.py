"""The conditioner's memory on the GPU beside the image models (benchmarks/engine.py's memory
table): the harness moves the whole bundle, conditioner included, to the device.

Counted on the meta device (no weights, no memory) from the released architectures: FLAN-T5-XL's
encoder (google/flan-t5-xl: d_model 2048, d_ff 5120, 24 layers, 32 heads of 64, vocabulary 32,128)
for LlamaGen; Qwen2.5-1.5B / 7B (hidden 1536 / 3584, MLP 8960 / 18944, 28 layers, 12 / 28 heads, 2 / 4
KV heads; embeddings tied at 1.5B only) with Tar's vocabulary (Qwen2.5's 151,665 tokens, TA-Tok's
65,536 codes and Tar's scale and boundary tokens: TAR_VOCAB) for Tar's LLM. Tar's LLM also holds
the KV cache of its batched `generate`: `model.llm.batch_size` rows x (prompt + 729 codes)
positions; the T5 encoder's activations (120 tokens) are negligible.
"""
from __future__ import annotations

from typing import Any

import torch

TAR_VOCAB = 151_665 + 65_536 + 8  # Qwen2.5 tokens + TA-Tok codes + Tar's scale / image boundary tokens
QWEN = {"tar_1.5b": {"hidden_size": 1536, "intermediate_size": 8960, "num_attention_heads": 12,
                     "num_key_value_heads": 2, "tie_word_embeddings": True},
        "tar_7b": {"hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
                   "num_key_value_heads": 4, "tie_word_embeddings": False}}
QWEN_LAYERS = 28
PROMPT_TOKENS = 100  # chat template + a GenEval / DPG-Bench prompt, before the 729 codes


def _param_bytes(model: torch.nn.Module, dtype_bytes: int) -> int:
    return sum(p.numel() for p in model.parameters()) * dtype_bytes


def conditioner_bytes(model_name: str, rows: int = 16, dtype_bytes: int = 2) -> int:
    """Bytes the conditioner of model `model_name` (llamagen_* or tar_1.5b_* / tar_7b_*) holds on
    the device in bf16: its weights, and for Tar's LLM the KV cache of a `rows`-row generate."""
    if model_name.startswith("llamagen"):
        from transformers import T5Config, T5EncoderModel

        config = T5Config(d_model=2048, d_ff=5120, num_layers=24, num_heads=32, d_kv=64, vocab_size=32128,
                          feed_forward_proj="gated-gelu")
        return _param_bytes(_on_meta(T5EncoderModel, config), dtype_bytes)
    size = "tar_7b" if model_name.startswith("tar_7b") else "tar_1.5b"
    from transformers import Qwen2Config, Qwen2ForCausalLM

    sizes = QWEN[size]
    config = Qwen2Config(vocab_size=TAR_VOCAB, num_hidden_layers=QWEN_LAYERS, **sizes)
    weights = _param_bytes(_on_meta(Qwen2ForCausalLM, config), dtype_bytes)
    head_dim = sizes["hidden_size"] // sizes["num_attention_heads"]
    kv = 2 * QWEN_LAYERS * sizes["num_key_value_heads"] * head_dim * dtype_bytes * rows * (PROMPT_TOKENS + 729)
    return weights + kv


def _on_meta(cls: Any, config: Any) -> torch.nn.Module:
    with torch.device("meta"):
        return cls(config)
