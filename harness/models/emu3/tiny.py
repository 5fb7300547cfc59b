"""`emu3_tiny`: a tiny random `Emu3ForConditionalGeneration`, built in code (no downloads), in the
layout of `BAAI/Emu3-Gen-hf`: a Llama-style text model whose vocabulary holds the image codes as
`<|visual token NNNNNN|>` entries of the vocabulary map (here in a shuffled order, so that the code
<-> vocabulary id map is exercised), the end-of-row token `<|extra_200|>`, and a MoVQGAN-style VQ
tokenizer with 8x spatial downsampling.

Vocabulary of the stand-in (TinyPromptTokenizer's): pad 0, BOS 1, EOS 2, image start 3, image end
4, end of frame 5, image wrapper 6 (`<|image token|>`), end of row 7, the `<image>` placeholder 8,
digits 10..19 and `*` 20 (the size header), words FIRST_WORD .. FIRST_CODE - 1, then the codes.

`arch.released`: the text model at the released Emu3-Gen size (`RELEASED`; `layers` may still
reduce the depth) over its 184622-id vocabulary, the VQ model's convolutions kept tiny (8x spatial
downsampling and the 32768 codes as released; image generation's forwards never run it).
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

PAD, BOS, EOS, BOI, EOI, EOF, WRAPPER, EOL, IMAGE = 0, 1, 2, 3, 4, 5, 6, 7, 8
DIGIT0, STAR, FIRST_WORD = 10, 20, 24
TINY = {"hidden": 32, "layers": 2, "heads": 4, "kv_heads": 2, "mlp": 64, "codes": 64, "words": 200,
        "vq_channels": 32}
# BAAI/Emu3-Gen-hf: transformers' convert_emu3_weights_to_hf.py builds the config as Emu3Config()
# with only max_position_embeddings (from the original LLM) and the vocabulary map set, so the text
# model is Emu3TextConfig's defaults: vocabulary 184622, width 4096, 32 layers, 32 query and 8
# key/value heads, MLP 14336, rope_theta 1e6, rms_norm_eps 1e-5; the VQ model's codebook 32768
# (Emu3VQVAEConfig's default). `words` fills the vocabulary: 184622 = 24 stand-in specials + words +
# 32768 codes, so the codes sit at ids 151854..184621 (in the stand-in's shuffled order; the real
# map's order is the tokenizer's). Not established here: max_position_embeddings (Emu3TextConfig's
# default is kept; rotary angles are computed per position, so it does not enter a forward).
VOCAB = 184622
RELEASED = {"emu3_gen": {"hidden": 4096, "layers": 32, "heads": 32, "kv_heads": 8, "mlp": 14336, "codes": 32768,
                         "words": VOCAB - FIRST_WORD - 32768, "vq_channels": 32}}


def visual_token(code: int) -> str:
    """The vocabulary name of image code `code` (transformers reads the code from characters -8:-2)."""
    return f"<|visual token {code:06d}|>"


def vocabulary_map(codes: int, first_code: int, seed: int) -> dict[str, int]:
    """The stand-in's vocabulary map: specials, then code c at id first_code + perm[c]."""
    perm = torch.randperm(codes, generator=torch.Generator().manual_seed(seed), device="cpu").tolist()
    names = {"<|extra_204|>": PAD, "<|extra_203|>": BOS, "<|endoftext|>": EOS, "<|image start|>": BOI,
             "<|image end|>": EOI, "<|extra_201|>": EOF, "<|image token|>": WRAPPER, "<|extra_200|>": EOL,
             "<image>": IMAGE, "*": STAR, **{str(d): DIGIT0 + d for d in range(10)}}
    return {**names, **{visual_token(c): first_code + perm[c] for c in range(codes)}}


def tiny_config(arch: dict[str, Any] | None = None, seed: int = 0):  # -> transformers.Emu3Config
    """An Emu3Config at TINY's sizes, or at `arch["released"]`'s (a key of RELEASED), the other keys
    of `arch` overriding them (keys of TINY; unknown keys refused)."""
    from transformers import Emu3Config, Emu3TextConfig, Emu3VQVAEConfig

    released = (arch or {}).get("released")
    if released is not None and released not in RELEASED:
        raise ValueError(f"model.arch.released={released!r} is not a released Emu3 size; use one of {sorted(RELEASED)}")
    a = {**(RELEASED[released] if released else TINY), **{k: v for k, v in (arch or {}).items() if k != "released"}}
    unknown = sorted(set(a) - set(TINY))
    if unknown:
        raise ValueError(f"model.arch has unknown keys {unknown}; the tiny Emu3 takes {sorted(TINY)} and "
                         f"`released` (one of {sorted(RELEASED)})")
    first_code = FIRST_WORD + int(a["words"])
    positions = {} if released else {"max_position_embeddings": 1024}
    text = Emu3TextConfig(vocab_size=first_code + int(a["codes"]), hidden_size=int(a["hidden"]),
                          intermediate_size=int(a["mlp"]), num_hidden_layers=int(a["layers"]),
                          num_attention_heads=int(a["heads"]), num_key_value_heads=int(a["kv_heads"]),
                          pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS, **positions)
    vq = Emu3VQVAEConfig(codebook_size=int(a["codes"]), embed_dim=4, latent_channels=4,
                         base_channels=int(a["vq_channels"]), channel_multiplier=[1, 2, 2, 4], num_res_blocks=1,
                         attn_resolutions=[], hidden_size=int(a["vq_channels"]) * 4, num_attention_heads=1)
    return Emu3Config(text_config=text, vq_config=vq, vocabulary_map=vocabulary_map(int(a["codes"]), first_code, seed))


def tiny_model(arch: dict[str, Any] | None, seed: int):  # -> transformers.Emu3ForConditionalGeneration
    """A seeded random tiny Emu3 (eval mode) with the repo's special ids in its generation config."""
    from transformers import Emu3ForConditionalGeneration

    torch.manual_seed(seed)
    model = Emu3ForConditionalGeneration(tiny_config(arch, seed)).eval()
    if not (arch or {}).get("released"):  # released sizes keep transformers' init (no collapse at full width)
        _spread(model, seed)
    gen = model.generation_config
    gen.bos_token_id, gen.pad_token_id, gen.eos_token_id = BOS, PAD, EOS
    return model


def _spread(model: nn.Module, seed: int) -> None:
    """Re-draw the text model and the LM head at unit gain (linear N(0, 1/fan_in), embeddings
    N(0, 1)): at transformers' init (std 0.02) a tiny model's greedy images collapse to one repeated
    code, which would let any decoder match any other."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for part in (model.model.text_model, model.lm_head):
            for sub in part.modules():
                if isinstance(sub, nn.Linear):
                    sub.weight.copy_(torch.randn(sub.weight.shape, generator=g) / math.sqrt(sub.in_features))
                elif isinstance(sub, nn.Embedding):
                    sub.weight.copy_(torch.randn(sub.weight.shape, generator=g))
