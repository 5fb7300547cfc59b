"""TA-Tok code embedding: Tar's discrete text-aligned codes -> the features AR-DTok is
conditioned on. Written for this project with the official key names of `ta_tok.pth`.

The path (Tar `tok/ta_tok.py` `decode_from_bottleneck`, `tok/ar_dtok/bottleneck.py` SimVQ):
codes [B, n] -> codebook rows of `embedding_proj(embedding.weight)` (l2-normalised)
-> `bottleneck.out_linear` -> a SigLIP2-style ViT decoder (`decoder.vision_model`: patch size 1,
3 pre-LN layers of width 1152, 12 heads, GELU-tanh MLP of 3072, learned 16x16 position table
bilinearly resized to the code grid, final `post_layernorm`) -> `decode_task_layer`
(Linear, Tanh, Linear) -> features [B, n, 1152]. The decoder's attention-pooling `head` exists in
the checkpoint but is not used on this path; it is kept so the keys load strictly.
Only the encoder half of TA-Tok (SigLIP2-so400m, `encoder.*`, `encode_task_layer.*`,
`bottleneck.in_linear.*`) is skipped: image -> code encoding is not needed for generation.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# checkpoint prefixes of the encoder half, which this module does not hold
UNUSED_PREFIXES = ("encoder.", "encode_task_layer.", "bottleneck.in_linear.", "scale_layer.", "teacher.")


@dataclass(frozen=True)
class TATokConfig:
    """Sizes of the TA-Tok decode path (defaults: the released `ta_tok.pth`, see the fixture header)."""

    codebook_size: int = 65536
    bottleneck_dim: int = 1536
    hidden: int = 1152
    layers: int = 3
    heads: int = 12
    mlp: int = 3072
    pos_table: int = 256  # SigLIP2 `num_patches`: a 16x16 learned table, resized per grid
    l2_norm: bool = True
    eps: float = 1e-6


class SiglipLayer(nn.Module):
    """Pre-LN encoder layer (`layer_norm1`, `self_attn.{q,k,v,out}_proj`, `layer_norm2`, `mlp.fc1/fc2`)."""

    def __init__(self, cfg: TATokConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.layer_norm1 = nn.LayerNorm(cfg.hidden, eps=cfg.eps)
        self.self_attn = nn.Module()
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            setattr(self.self_attn, name, nn.Linear(cfg.hidden, cfg.hidden))
        self.layer_norm2 = nn.LayerNorm(cfg.hidden, eps=cfg.eps)
        self.mlp = _mlp(cfg)

    def forward(self, x: Tensor) -> Tensor:
        """x [B, n, hidden] -> [B, n, hidden] (no mask: every code sees every code)."""
        b, n, d = x.shape
        h = self.layer_norm1(x)
        a = self.self_attn
        q, k, v = (m(h).view(b, n, self.heads, d // self.heads).transpose(1, 2)
                   for m in (a.q_proj, a.k_proj, a.v_proj))
        out = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d)
        x = x + a.out_proj(out)
        return x + self.mlp.fc2(F.gelu(self.mlp.fc1(self.layer_norm2(x)), approximate="tanh"))


def _mlp(cfg: TATokConfig) -> nn.Module:
    mlp = nn.Module()
    mlp.fc1 = nn.Linear(cfg.hidden, cfg.mlp)
    mlp.fc2 = nn.Linear(cfg.mlp, cfg.hidden)
    return mlp


class PoolingHead(nn.Module):
    """SigLIP2's attention-pooling head (`probe`, `attention`, `layernorm`, `mlp`): held for the
    checkpoint's keys only; the TA-Tok decode path reads the hidden states before it."""

    def __init__(self, cfg: TATokConfig) -> None:
        super().__init__()
        self.probe = nn.Parameter(torch.zeros(1, 1, cfg.hidden))
        self.attention = nn.MultiheadAttention(cfg.hidden, cfg.heads, batch_first=True)
        self.layernorm = nn.LayerNorm(cfg.hidden, eps=cfg.eps)
        self.mlp = _mlp(cfg)


class VisionDecoder(nn.Module):
    """`decoder.vision_model`: [B, n, bottleneck_dim] on a square grid -> [B, n, hidden]."""

    def __init__(self, cfg: TATokConfig) -> None:
        super().__init__()
        self.embeddings = nn.Module()
        self.embeddings.patch_embedding = nn.Linear(cfg.bottleneck_dim, cfg.hidden)
        self.embeddings.position_embedding = nn.Embedding(cfg.pos_table, cfg.hidden)
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList(SiglipLayer(cfg) for _ in range(cfg.layers))
        self.post_layernorm = nn.LayerNorm(cfg.hidden, eps=cfg.eps)
        self.head = PoolingHead(cfg)

    def positions(self, side: int) -> Tensor:
        """The learned square table resized (bilinear, antialiased, in float32) to side x side
        -> [side^2, hidden]."""
        table = self.embeddings.position_embedding.weight
        src = int(math.isqrt(table.shape[0]))
        grid = table.float().reshape(src, src, -1).permute(2, 0, 1)[None]
        out = F.interpolate(grid, size=(side, side), mode="bilinear", align_corners=False, antialias=True)
        return out[0].reshape(table.shape[1], side * side).t().to(table.dtype)

    def forward(self, z: Tensor) -> Tensor:
        side = int(math.isqrt(z.shape[1]))
        if side * side != z.shape[1]:
            raise ValueError(f"TA-Tok codes form a square grid; got {z.shape[1]} codes")
        emb = self.embeddings.patch_embedding
        h = emb(z.to(emb.weight.dtype)) + self.positions(side)
        for layer in self.encoder.layers:
            h = layer(h)
        return self.post_layernorm(h)


class TATokCodeEmbedding(nn.Module):
    """codes [B, n] (int64 in [0, codebook_size)) -> AR-DTok condition features [B, n, hidden]."""

    def __init__(self, cfg: TATokConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or TATokConfig()
        self.bottleneck = nn.Module()
        self.bottleneck.regularizer = nn.Module()
        self.bottleneck.regularizer.embedding = nn.Embedding(cfg.codebook_size, cfg.bottleneck_dim)
        self.bottleneck.regularizer.embedding_proj = nn.Linear(cfg.bottleneck_dim, cfg.bottleneck_dim)
        self.bottleneck.out_linear = nn.Linear(cfg.bottleneck_dim, cfg.bottleneck_dim)
        self.decoder = nn.Module()
        self.decoder.vision_model = VisionDecoder(cfg)
        self.decode_task_layer = nn.Sequential(nn.Linear(cfg.hidden, cfg.hidden), nn.Tanh(),
                                               nn.Linear(cfg.hidden, cfg.hidden))

    def code_vectors(self, codes: Tensor) -> Tensor:
        """codes [B, n] -> projected (l2-normalised) code vectors [B, n, bottleneck_dim]. The
        projection is row-wise, so only the rows in use are projected (not all 65536)."""
        reg = self.bottleneck.regularizer
        z = reg.embedding_proj(reg.embedding(codes))
        return F.normalize(z, p=2, dim=-1) if self.cfg.l2_norm else z

    @torch.inference_mode()
    def forward(self, codes: Tensor) -> Tensor:
        """codes [B, n] -> features [B, n, hidden]."""
        z = self.code_vectors(codes.to(self.bottleneck.out_linear.weight.device))
        h = self.decoder.vision_model(self.bottleneck.out_linear(z))
        return self.decode_task_layer(h)


def decode_path_state(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Keep the decode-path tensors of a full `ta_tok.pth` state dict; the encoder half is dropped
    by name (UNUSED_PREFIXES), anything else is left in so strict loading reports it."""
    return {k: v for k, v in state.items() if not k.startswith(UNUSED_PREFIXES)}
