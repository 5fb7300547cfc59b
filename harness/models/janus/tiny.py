"""`janus_tiny`: a tiny random `JanusForConditionalGeneration`, built in code (no downloads), in the
layout and with the generation settings of the Janus-Pro repos: a Llama language model, the
generation embedding / aligner / head, a VQ-16-layout tokenizer (16x downsampling) and an
understanding tower (unused by image generation, present so that the key layout is the real one).

Special ids of the stand-in (the repos': pad 100015, BOS 100000, image-start 100016).
"""
from __future__ import annotations

from typing import Any

import math

import torch
from torch import nn

PAD, BOS, EOS, BOI, IMAGE = 0, 1, 2, 3, 6  # the tiny vocabulary's special ids (TinyPromptTokenizer's)
TINY = {"vocab": 320, "hidden": 32, "layers": 2, "heads": 4, "kv_heads": 2, "mlp": 64, "grid": 4, "codes": 64}


def tiny_config(arch: dict[str, Any] | None = None):  # -> transformers.JanusConfig
    """A JanusConfig at TINY's sizes, `arch` overriding them (keys of TINY; unknown keys refused)."""
    from transformers import JanusConfig, JanusVisionConfig, JanusVQVAEConfig, LlamaConfig

    a = {**TINY, **(arch or {})}
    unknown = sorted(set(a) - set(TINY))
    if unknown:
        raise ValueError(f"model.arch has unknown keys {unknown}; the tiny Janus takes {sorted(TINY)}")
    grid, hidden = int(a["grid"]), int(a["hidden"])
    text = LlamaConfig(vocab_size=a["vocab"], hidden_size=hidden, intermediate_size=a["mlp"],
                       num_hidden_layers=a["layers"], num_attention_heads=a["heads"],
                       num_key_value_heads=a["kv_heads"], max_position_embeddings=256,
                       bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)
    vision = JanusVisionConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, image_size=16 * grid,
                               patch_size=16, projection_dim=hidden, num_image_tokens=grid * grid, mlp_ratio=2.0)
    vq = JanusVQVAEConfig(embed_dim=8, num_embeddings=a["codes"], base_channels=32, num_res_blocks=1,
                          latent_channels=32, projection_dim=hidden, image_token_embed_dim=hidden)
    return JanusConfig(text_config=text, vision_config=vision, vq_config=vq, image_token_id=IMAGE)


def tiny_model(arch: dict[str, Any] | None, seed: int):  # -> transformers.JanusForConditionalGeneration
    """A seeded random tiny Janus with the repos' image-generation settings in its generation
    config (CFG 5, temperature 1; pad / BOS / image-start ids)."""
    from transformers import JanusForConditionalGeneration

    torch.manual_seed(seed)
    model = JanusForConditionalGeneration(tiny_config(arch)).eval()
    _spread(model, seed)
    gen = model.generation_config
    gen._from_model_config = False  # as the repos' conversion sets it: a reload keeps generation_kwargs
    gen.bos_token_id, gen.pad_token_id, gen.eos_token_id = BOS, PAD, EOS
    gen.guidance_scale, gen.temperature = 5, 1
    gen.generation_kwargs = {"boi_token_id": BOI}
    return model


def _spread(model: nn.Module, seed: int) -> None:
    """Re-draw the generation path's weights at unit gain (linear N(0, 1/fan_in), embeddings N(0, 1)):
    at transformers' init (std 0.02) a tiny model's greedy images collapse to one repeated code,
    which would let any decoder match any other."""
    g = torch.Generator().manual_seed(seed)
    parts = (model.model.language_model, model.model.generation_embeddings, model.model.generation_aligner,
             model.model.generation_head)
    with torch.no_grad():
        for part in parts:
            for sub in part.modules():
                if isinstance(sub, nn.Linear):
                    sub.weight.copy_(torch.randn(sub.weight.shape, generator=g) / math.sqrt(sub.in_features))
                elif isinstance(sub, nn.Embedding):
                    sub.weight.copy_(torch.randn(sub.weight.shape, generator=g))
