"""`janus_tiny`: a tiny random `JanusForConditionalGeneration`, built in code (no downloads), in the
layout and with the generation settings of the Janus-Pro repos: a Llama language model, the
generation embedding / aligner / head, a VQ-16-layout tokenizer (16x downsampling) and an
understanding tower (unused by image generation, present so that the key layout is the real one).

Special ids of the stand-in (the repos': pad 100015, BOS 100000, image-start 100016).

`arch.released`: the language model and generation path at a released Janus-Pro size (`RELEASED`;
`layers` may still reduce the depth), the understanding tower and the VQ model's convolutions kept
tiny (image generation's forwards never run them; their grid and codebook are the released ones).
"""
from __future__ import annotations

from typing import Any

import math

import torch
from torch import nn

PAD, BOS, EOS, BOI, IMAGE = 0, 1, 2, 3, 6  # the tiny vocabulary's special ids (TinyPromptTokenizer's)
TINY = {"vocab": 320, "hidden": 32, "layers": 2, "heads": 4, "kv_heads": 2, "mlp": 64, "grid": 4, "codes": 64}
# The language models of the Hugging Face-format repos deepseek-community/Janus-Pro-1B and -7B.
# transformers' convert_janus_weights_to_hf.py builds their text config as a LlamaConfig of the
# original repos' `language_config` keys (vocab_size, hidden_size, intermediate_size,
# num_hidden_layers, num_attention_heads, num_key_value_heads, ...), everything else at LlamaConfig's
# defaults (rope_theta 10000, rms_norm_eps 1e-6); the generation aligner's and head's widths are the
# LLM's (gen_aligner / gen_head `n_embed`, `image_token_embed`), the codes 16384 (gen_vision
# `image_token_size`) of dimension 8, the grid 384 / 16 = 24. The sizes: the 1B's language_config
# (2048 wide, 24 layers, 16 heads and key/value heads, MLP 5632, vocabulary 102400) as quoted in
# public copies of its config.json; the 7B's is DeepSeek-LLM-7B's (4096, 30 layers, 32 and 32 heads,
# MLP 11008, vocabulary 102400), the Janus-Pro report's 7B backbone. Not established here:
# max_position_embeddings (left at LlamaConfig's default; rotary angles are computed per position,
# so it does not enter a forward).
RELEASED = {
    "janus_pro_1b": {"vocab": 102400, "hidden": 2048, "layers": 24, "heads": 16, "kv_heads": 16, "mlp": 5632,
                     "grid": 24, "codes": 16384},
    "janus_pro_7b": {"vocab": 102400, "hidden": 4096, "layers": 30, "heads": 32, "kv_heads": 32, "mlp": 11008,
                     "grid": 24, "codes": 16384},
}


def tiny_config(arch: dict[str, Any] | None = None):  # -> transformers.JanusConfig
    """A JanusConfig at TINY's sizes, or at `arch["released"]`'s (a key of RELEASED), the other
    keys of `arch` overriding them (keys of TINY; unknown keys refused)."""
    from transformers import JanusConfig, JanusVisionConfig, JanusVQVAEConfig, LlamaConfig

    a = {**base_sizes(arch), **{k: v for k, v in (arch or {}).items() if k != "released"}}
    unknown = sorted(set(a) - set(TINY))
    if unknown:
        raise ValueError(f"model.arch has unknown keys {unknown}; the tiny Janus takes {sorted(TINY)} and "
                         f"`released` (one of {sorted(RELEASED)})")
    grid, hidden = int(a["grid"]), int(a["hidden"])
    text = LlamaConfig(vocab_size=a["vocab"], hidden_size=hidden, intermediate_size=a["mlp"],
                       num_hidden_layers=a["layers"], num_attention_heads=a["heads"],
                       num_key_value_heads=a["kv_heads"], bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD,
                       **({} if (arch or {}).get("released") else {"max_position_embeddings": 256}))
    vision = JanusVisionConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, image_size=16 * grid,
                               patch_size=16, projection_dim=hidden, num_image_tokens=grid * grid, mlp_ratio=2.0)
    vq = JanusVQVAEConfig(embed_dim=8, num_embeddings=a["codes"], base_channels=32, num_res_blocks=1,
                          latent_channels=32, projection_dim=hidden, image_token_embed_dim=hidden)
    return JanusConfig(text_config=text, vision_config=vision, vq_config=vq, image_token_id=IMAGE)


def base_sizes(arch: dict[str, Any] | None) -> dict[str, int]:
    """TINY, or the RELEASED sizes `arch["released"]` names (a clear error for an unknown name)."""
    name = (arch or {}).get("released")
    if name is None:
        return dict(TINY)
    if name not in RELEASED:
        raise ValueError(f"model.arch.released={name!r} is not a released Janus-Pro size; use one of {sorted(RELEASED)}")
    return dict(RELEASED[name])


def tiny_model(arch: dict[str, Any] | None, seed: int):  # -> transformers.JanusForConditionalGeneration
    """A seeded random tiny Janus with the repos' image-generation settings in its generation
    config (CFG 5, temperature 1; pad / BOS / image-start ids)."""
    from transformers import JanusForConditionalGeneration

    torch.manual_seed(seed)
    model = JanusForConditionalGeneration(tiny_config(arch)).eval()
    if not (arch or {}).get("released"):  # released sizes keep transformers' init (no collapse at full width)
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
