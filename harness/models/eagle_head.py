"""The EAGLE head (Li et al., EAGLE-1/2; LANTERN's LlamaGen drafter): one decoder layer that drafts
the target's next hidden state from its last one, sharing the target's output layer.

Architecture and key names follow LANTERN (github.com/jadohu/LANTERN @3a56e45,
`models/drafters/cnets_llamagen.py`), so the released heads `jadohu/llamagen_drafter` (256 px) and
`jadohu/llamagen2_drafter` (512 px) load strictly:

    embed_tokens.weight                         [V, dim]        frozen token embedding (in the head file)
    fc.weight, fc.bias                          [dim, 2 dim]    Linear over cat(embedding, feature)
    layers.0.self_attn.{q,k,v,o}_proj.weight    no biases, heads of the target's head width
    layers.0.mlp.{gate,up,down}_proj.weight     SwiGLU: down(silu(gate x) * up x)
    layers.0.post_attention_layernorm.weight    RMSNorm (eps 1e-6, computed in float32)

There is no input norm before the attention, no final norm and no output layer: the head's output h
goes through the target's output layer (`head_logits`).

Sequence (cache slots of the head): head index i pairs the target's hidden state at sequence slot
i (after its final norm: `last_hidden`) with the token at slot i + 1 (0 at a caption slot, as
LANTERN pads) and predicts the target's hidden state at slot i + 1. It is encoded at the position
of its token, slot i + 1, with the target's own position code (`positional`: LlamaGen's 2-D rotary
table, whose caption rows are zero, so the head rotates by the raster position of its input token,
as LANTERN's 119 zero rows do; Tar's absolute table is added to the fc output). The head attends
without the caption padding mask (LANTERN calls its drafter without one).

Backbones with 1-D rotary positions (Lumina-mGPT, Janus-Pro, Emu3) describe themselves to a head
with a `TargetSpec` (their `head_spec`); their `positional` returns a 1-D rotary table of each
slot's own rotary position (end-of-row slots counted, each row from its first real token:
harness/models/row_ends.py), so a head drafts in the backbone's own position code.

LANTERN's Lumina-mGPT head (`models/drafters/cnets_lumina_mgpt.py` @3a56e45: a one-layer Chameleon
decoder, config.json with `model_type: chameleon`) adds, per layer, `input_layernorm.weight` (RMSNorm
before the attention) and Chameleon's per-head query/key LayerNorm
`self_attn.{q,k}_norm.{weight,bias}` [model_parallel_size, head_dim]; it rotates in the rotate-half
convention over the full 65536-id vocabulary embedding. `load_lantern` reads it strictly under
those names, then permutes the query/key channels into the interleaved pairs the shared `attend`
rotates (a common permutation of q and k leaves every score unchanged) and keeps the embedding
rows of the image codes (`vocab_ids`).

A head is made for one target: its width, head width, vocabulary, token grid and caption slots
must match (`check_compatible` names both sides). Files: LANTERN's `config.json` +
`pytorch_model.bin` or `model.safetensors` (`load_lantern`), or this project's safetensors with the
config in the metadata
(`save_head` / `load_trained`, written by `python -m baselines.training.train_eagle`).
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.models.gpt import GPTConfig
from harness.models.lumina.chameleon import HeadNorm
from harness.models.hub import WeightsError, damaged, load_strict, read_checkpoint, resolve, state_dict_of
from harness.models.transformer import KVCache, RMSNorm, attend

log = logging.getLogger(__name__)

# LANTERN's `input_type` -> (token grid, caption slots of the target): cnets_llamagen.py sets the
# grid from it and pads 119 = 120 - 1 caption rows of zeros.
LANTERN_INPUT_TYPES = {"t2i": ((16, 16), 120), "t2i2": ((32, 32), 120)}
Positional = Callable[[Tensor, Tensor], "tuple[Tensor, Tensor | None]"]


@dataclass(frozen=True)
class EagleHeadConfig:
    """The head's sizes and the target it drafts for (grid, caption slots)."""

    dim: int
    n_head: int
    vocab_size: int
    grid: tuple[int, int]
    prefix_len: int
    ffn_dim: int
    n_kv_head: int | None = None
    norm_eps: float = 1e-6
    fc_bias: bool = True
    input_norm: bool = False  # RMSNorm before the attention (LANTERN's Chameleon head)
    qk_norm_shards: int = 0  # Chameleon's per-head q/k LayerNorm with this many affines; 0: none

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @classmethod
    def for_target(cls, target: "GPTConfig | TargetSpec", **overrides: Any) -> "EagleHeadConfig":
        """A head of the target's width, heads, vocabulary, grid and feed-forward width (LANTERN's
        LlamaGen head: intermediate 3584 = GPT-XL's; a TargetSpec names its own)."""
        if isinstance(target, TargetSpec):
            hidden = target.ffn_dim
        else:
            hidden = int(2 * 4 * target.dim / 3)
            if target.ffn_dim_multiplier is not None:
                hidden = int(target.ffn_dim_multiplier * hidden)
            hidden = -(-hidden // target.multiple_of) * target.multiple_of
        base = dict(dim=target.dim, n_head=target.n_head, n_kv_head=target.n_kv_head,
                    vocab_size=target.vocab_size, grid=tuple(target.grid), prefix_len=target.prefix_len,
                    ffn_dim=hidden)
        return cls(**{**base, **overrides})

    @classmethod
    def from_lantern(cls, config: Mapping[str, Any], where: str) -> "EagleHeadConfig":
        """LANTERN's drafter `config.json` (a Llama config with `input_type`) -> EagleHeadConfig."""
        kind = config.get("input_type")
        if kind not in LANTERN_INPUT_TYPES:
            raise WeightsError(f"{where}: input_type {kind!r} is not a LANTERN text-to-image LlamaGen head "
                               f"(one of {sorted(LANTERN_INPUT_TYPES)})")
        if config.get("num_hidden_layers", 1) != 1:
            raise WeightsError(f"{where}: num_hidden_layers {config['num_hidden_layers']}; an EAGLE head "
                               "has 1")
        try:
            grid, prefix = LANTERN_INPUT_TYPES[kind]
            return cls(dim=int(config["hidden_size"]), n_head=int(config["num_attention_heads"]),
                       n_kv_head=int(config.get("num_key_value_heads") or config["num_attention_heads"]),
                       vocab_size=int(config["vocab_size"]), grid=grid, prefix_len=prefix,
                       ffn_dim=int(config["intermediate_size"]),
                       norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                       fc_bias=bool(config.get("bias", True)))
        except KeyError as err:
            raise WeightsError(f"{where} lacks the key {err}; not a LANTERN drafter config.json") from err

    @classmethod
    def from_lantern_chameleon(cls, config: Mapping[str, Any], where: str, target: "TargetSpec") -> "EagleHeadConfig":
        """LANTERN's Lumina-mGPT drafter `config.json` (a Chameleon config, one hidden layer) ->
        EagleHeadConfig; the grid and caption slots are the target's (the config names neither)."""
        if config.get("num_hidden_layers", 1) != 1:
            raise WeightsError(f"{where}: num_hidden_layers {config['num_hidden_layers']}; an EAGLE head has 1")
        try:
            return cls(dim=int(config["hidden_size"]), n_head=int(config["num_attention_heads"]),
                       n_kv_head=int(config.get("num_key_value_heads") or config["num_attention_heads"]),
                       vocab_size=int(config["vocab_size"]), grid=tuple(target.grid), prefix_len=target.prefix_len,
                       ffn_dim=int(config["intermediate_size"]), norm_eps=float(config.get("rms_norm_eps", 1e-5)),
                       fc_bias=bool(config.get("bias", True)), input_norm=True,
                       qk_norm_shards=int(config.get("model_parallel_size", 1)))
        except KeyError as err:
            raise WeightsError(f"{where} lacks the key {err}; not a LANTERN Chameleon drafter config.json") from err

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "EagleHeadConfig":
        values = json.loads(text)
        values["grid"] = tuple(values["grid"])
        return cls(**values)


@dataclass(frozen=True)
class TargetSpec:
    """What a head must match in a target that is not the project's GPT (Lumina-mGPT, Janus-Pro,
    Emu3: their `head_spec`): width, heads, image codes, grid, condition slots, the feed-forward
    width a fresh head takes, and the position code (`rope1d`: 1-D rotary positions)."""

    dim: int
    n_head: int
    n_kv_head: int
    vocab_size: int
    grid: tuple[int, int]
    prefix_len: int
    ffn_dim: int
    pos_embed: str = "rope1d"

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head


def text_model_spec(model: Any) -> TargetSpec:
    """The TargetSpec of an image model over a transformers text model (Janus-Pro, Emu3): sizes from
    `model.hf.config.text_config`, heads, codes, grid and condition slots from the model."""
    text = model.hf.config.text_config
    return TargetSpec(dim=int(text.hidden_size), n_head=model.n_head, n_kv_head=model.n_kv_head,
                      vocab_size=model.vocab_size, grid=model.grid, prefix_len=model.prefix_len,
                      ffn_dim=int(text.intermediate_size))


class HeadAttention(nn.Module):
    """Llama attention with separate q/k/v/o projections (LANTERN's names) and a static cache."""

    def __init__(self, cfg: EagleHeadConfig) -> None:
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        self.n_kv_head = cfg.n_kv_head or cfg.n_head
        self.q_proj = nn.Linear(cfg.dim, cfg.n_head * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.dim, self.n_kv_head * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.dim, self.n_kv_head * self.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_head * self.head_dim, cfg.dim, bias=False)
        if cfg.qk_norm_shards:  # LANTERN's Chameleon head: per-head LayerNorm of queries and keys
            self.q_norm = HeadNorm(cfg.qk_norm_shards, cfg.n_head, self.head_dim)
            self.k_norm = HeadNorm(min(cfg.qk_norm_shards, self.n_kv_head), self.n_kv_head, self.head_dim)
        self.kv_cache: KVCache | None = None

    def forward(self, x: Tensor, rope: Tensor | None, mask: Tensor | None, write: Tensor | None) -> Tensor:
        """x [R, T, dim]; rope [R, T, hd/2, 2] or None; mask [R, 1, T, S] bool or None (causal, no
        cache: training); write [R, T] cache slots or None."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_head, self.head_dim)
        k = self.k_proj(x).view(b, t, self.n_kv_head, self.head_dim)
        v = self.v_proj(x).view(b, t, self.n_kv_head, self.head_dim)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q).to(x.dtype), self.k_norm(k).to(x.dtype)  # normed in float32
        return self.o_proj(attend(q, k, v, rope, mask, write, self.kv_cache))


class HeadMLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class HeadLayer(nn.Module):
    """LANTERN's decoder layer 0: h = x + attn(x); out = h + mlp(norm(h)) (no input norm; the
    Chameleon head's `input_norm`: h = x + attn(norm(x)))."""

    def __init__(self, cfg: EagleHeadConfig) -> None:
        super().__init__()
        self.self_attn = HeadAttention(cfg)
        self.mlp = HeadMLP(cfg.dim, cfg.ffn_dim)
        if cfg.input_norm:
            self.input_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)

    def forward(self, x: Tensor, rope: Tensor | None, mask: Tensor | None, write: Tensor | None) -> Tensor:
        normed = self.input_layernorm(x) if hasattr(self, "input_layernorm") else x
        h = x + self.self_attn(normed, rope, mask, write)
        return h + self.mlp(self.post_attention_layernorm(h))


class EagleHead(nn.Module):
    """The head (module docstring). `forward` maps target features and tokens to drafted features;
    the caller turns them into logits with the target's output layer."""

    def __init__(self, cfg: EagleHeadConfig) -> None:
        super().__init__()
        if cfg.dim % cfg.n_head:
            raise ValueError(f"EAGLE head width {cfg.dim} is not divisible by its {cfg.n_head} heads")
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.embed_tokens.weight.requires_grad_(False)  # frozen, as in LANTERN and EAGLE
        self.fc = nn.Linear(2 * cfg.dim, cfg.dim, bias=cfg.fc_bias)
        self.layers = nn.ModuleList([HeadLayer(cfg)])

    def setup_cache(self, rows: int, slots: int, dtype: torch.dtype | None = None) -> None:
        """A zeroed static cache of `slots` slots for `rows` rows (the target's rows: 2B with CFG),
        reused across calls of one shape."""
        w = self.fc.weight
        att = self.layers[0].self_attn
        att.kv_cache = KVCache.reuse(att.kv_cache, rows, att.n_kv_head, slots, att.head_dim, dtype or w.dtype,
                                     w.device)

    def forward(self, features: Tensor, tokens: Tensor, seq_slots: Tensor, positional: Positional,
                mask: Tensor | None = None, write: Tensor | None = None) -> Tensor:
        """features [R, T, dim] (target hidden states after its final norm, or the head's own output
        for drafted nodes), tokens [R, T] (the token after each feature), seq_slots [R, T] (the
        target sequence slot of each token: prefix_len + position), positional: the target's
        position code (GPT.positional); mask [R, T, S] bool or None (causal, no cache); write [R, T]
        cache slots or None. Returns the drafted features [R, T, dim]."""
        emb = self.embed_tokens(tokens).to(self.fc.weight.dtype)
        h = self.fc(torch.cat([emb, features.to(self.fc.weight.dtype)], dim=-1))
        h, rope = positional(h, seq_slots)
        return self.layers[0](h, rope, None if mask is None else mask.unsqueeze(1), write)


# ----------------------------------------------------------------------------- compatibility
def check_compatible(head: EagleHeadConfig, target: "GPTConfig | TargetSpec", where: str) -> None:
    """Refuse a head that was not made for `target`, naming both sides (`where`: the head's file)."""
    problems = []
    if head.dim != target.dim:
        problems.append(f"width {head.dim} vs the target's {target.dim}")
    elif head.head_dim != target.head_dim and target.pos_embed in ("rope2d", "rope1d"):
        problems.append(f"head width {head.head_dim} ({head.n_head} heads) vs the target's {target.head_dim} "
                        f"({target.n_head} heads): the head uses the target's rotary table")
    if head.vocab_size != target.vocab_size:
        problems.append(f"vocabulary {head.vocab_size} vs the target's {target.vocab_size}")
    if tuple(head.grid) != tuple(target.grid):
        problems.append(f"token grid {tuple(head.grid)} vs the target's {tuple(target.grid)}")
    if head.prefix_len != target.prefix_len:
        problems.append(f"caption slots {head.prefix_len} vs the target's {target.prefix_len}")
    if problems:
        raise WeightsError(f"the EAGLE head {where} does not fit this target: {'; '.join(problems)}. "
                           "Use the head made for this model (or train one: python -m baselines.training.train_eagle)")


# ----------------------------------------------------------------------------- files
def random_head(target_cfg: "GPTConfig | TargetSpec", tok_embeddings: Tensor, seed: int = 0,
                **overrides: Any) -> EagleHead:
    """A seeded, untrained head for `target_cfg` (tests, tiny stacks, the start of training):
    N(0, 0.02) weights, the frozen embedding copied from the target's token embedding."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = EagleHead(EagleHeadConfig.for_target(target_cfg, **overrides))
        for m in head.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
    with torch.no_grad():
        head.embed_tokens.weight.copy_(tok_embeddings.detach().float())
    return head.eval()


def load_lantern(config_path: Path, weights_path: Path, trust_pickle: bool = False,
                 target: "GPTConfig | TargetSpec | None" = None, vocab_ids: Tensor | None = None) -> EagleHead:
    """A released LANTERN head: its `config.json` and `pytorch_model.bin` (or model.safetensors),
    loaded strictly. A Chameleon head (config `model_type: chameleon`, Lumina-mGPT) takes its grid
    and caption slots from `target` (a TargetSpec) and keeps the embedding rows `vocab_ids` [V]
    (the vocabulary id of each image code) after the strict load."""
    try:
        config = json.loads(Path(config_path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise WeightsError(f"cannot read the EAGLE head config {config_path}: {err}") from err
    chameleon = config.get("model_type") == "chameleon"
    if chameleon:
        if not isinstance(target, TargetSpec) or vocab_ids is None:
            raise WeightsError(f"{config_path} is LANTERN's Chameleon (Lumina-mGPT) head: it drafts for a "
                               "Lumina-mGPT target only")
        cfg = EagleHeadConfig.from_lantern_chameleon(config, str(config_path), target)
    else:
        cfg = EagleHeadConfig.from_lantern(config, str(config_path))
    head = EagleHead(cfg)
    state = state_dict_of(read_checkpoint(Path(weights_path), trust_pickle), Path(weights_path))
    load_strict(head, state, weights_path, "EAGLE head (LANTERN)")
    if chameleon:
        head = _from_chameleon(head, vocab_ids, str(weights_path))  # type: ignore[arg-type]
    return head.eval()


def _from_chameleon(head: EagleHead, vocab_ids: Tensor, where: str) -> EagleHead:
    """LANTERN's Chameleon head as the shared head runs it: query/key channels from rotate-half
    pairs (j, j + hd/2) to interleaved pairs (2j, 2j + 1) in q_proj / k_proj rows and the q/k-norm
    affines, and the embedding rows of the image codes only (vocabulary ids `vocab_ids` [V])."""
    cfg = head.cfg
    if int(vocab_ids.max()) >= cfg.vocab_size:
        raise WeightsError(f"{where}: the head embeds {cfg.vocab_size} vocabulary ids; the target's image codes "
                           f"reach id {int(vocab_ids.max())}")
    hd = cfg.head_dim
    order = torch.stack([torch.arange(hd // 2), torch.arange(hd // 2) + hd // 2], -1).flatten()  # new c <- old
    att = head.layers[0].self_attn
    with torch.no_grad():
        for proj, heads in ((att.q_proj, cfg.n_head), (att.k_proj, att.n_kv_head)):
            w = proj.weight.view(heads, hd, -1)
            proj.weight.copy_(w[:, order].reshape(heads * hd, -1))
        for norm in (att.q_norm, att.k_norm):
            norm.weight.copy_(norm.weight[:, order])
            norm.bias.copy_(norm.bias[:, order])
    out = EagleHead(replace(cfg, vocab_size=int(vocab_ids.numel())))
    state = dict(head.state_dict())
    state["embed_tokens.weight"] = state["embed_tokens.weight"][vocab_ids.long().cpu()]
    out.load_state_dict(state)
    return out


HEAD_META = "eagle_head"


def save_head(head: EagleHead, path: Path, info: Mapping[str, Any] | None = None,
              dtype: torch.dtype = torch.float16) -> None:
    """Write a head as safetensors (`dtype` storage) with its config and `info` in the metadata."""
    from safetensors.torch import save_file

    state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in head.state_dict().items()}
    meta = {HEAD_META: head.cfg.to_json(), "info": json.dumps(dict(info or {}), sort_keys=True)}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path), metadata=meta)
    os.chmod(path, 0o644)  # readable like the other shipped weights (safetensors writes 0600)


def _safetensors(path: Path) -> tuple[dict[str, str], Callable[[], dict[str, Tensor]]]:
    """(metadata, a reader of the tensors) of a safetensors file; WeightsError naming the file and
    saying to fetch it again when it cannot be read (truncated, damaged)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = dict(f.metadata() or {})
    except Exception as err:  # noqa: BLE001 - SafetensorError, OSError: a damaged file either way
        raise damaged(path, err) from err

    def tensors() -> dict[str, Tensor]:
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                return {k: f.get_tensor(k) for k in f.keys()}
        except Exception as err:  # noqa: BLE001
            raise damaged(path, err) from err
    return meta, tensors


def load_trained(path: Path) -> EagleHead:
    """A head written by `save_head` (python -m baselines.training.train_eagle), loaded strictly."""
    meta, tensors = _safetensors(path)
    state = tensors()
    if HEAD_META not in meta:
        raise WeightsError(f"{path} has no '{HEAD_META}' metadata; not an EAGLE head written by "
                           "python -m baselines.training.train_eagle")
    head = EagleHead(EagleHeadConfig.from_json(meta[HEAD_META]))
    load_strict(head, {k: v.float() for k, v in state.items()}, path, "EAGLE head")
    return head.eval()


def has_head_metadata(path: Path) -> bool:
    """Whether a safetensors file carries this project's head config (`save_head`); LANTERN's
    `model.safetensors` (read by its from_pretrained when pytorch_model.bin is absent) does not."""
    return HEAD_META in _safetensors(path)[0]


def read_info(path: Path) -> dict[str, Any]:
    """The `info` metadata of a saved head (training settings and losses)."""
    return json.loads(_safetensors(path)[0].get("info", "{}"))


def build_head(target_cfg: "GPTConfig | TargetSpec", tok_embeddings: Tensor, *,
               file: str | Sequence[str] | None = None,
               config_file: str | None = None, repo_id: str | None = None, local_dir: str | None = None,
               cache_dir: str | None = None, random: bool = False, seed: int = 0,
               trust_pickle: bool = False, vocab_ids: Tensor | None = None) -> EagleHead:
    """The EAGLE head a model config names, checked against the target:

    - `random`: a seeded untrained head (random_head), unless `file` is a path to an existing file
      (a head trained for a random stand-in: loaded as below);
    - `file` ending in .safetensors with the head config in its metadata: a head this project
      trained (load_trained);
    - otherwise LANTERN's release: `file` (pytorch_model.bin, or model.safetensors as LANTERN's
      from_pretrained falls back to) and `config_file` (config.json); a Chameleon head keeps the
      embedding rows `vocab_ids` (load_lantern).
    A file with a directory part is a path; a bare name is read from `local_dir` or downloaded from
    the Hugging Face repo `repo_id` (harness.models.hub.resolve). A list of names is tried in its order,
    the first found is read: LANTERN's own loader tries `pytorch_model.bin`, then `model.safetensors`.
    """
    names = [str(n) for n in file] if isinstance(file, (list, tuple)) else ([str(file)] if file else [])
    file = names[0] if len(names) == 1 else (names or None)
    trained_file = isinstance(file, str) and Path(file).name != file and Path(file).expanduser().is_file()
    if random and not trained_file:
        return random_head(target_cfg, tok_embeddings, seed)
    if not file:
        raise WeightsError("model.eagle_head_file is not set: name the head's weights file (or its repo "
                           "with model.eagle_head_repo)")

    def find(name: str) -> Path:
        if Path(name).name != name or name.startswith("~"):  # a path, not a bare file name
            path = Path(name).expanduser()
            if not path.is_file():
                raise WeightsError(f"EAGLE head file {path} does not exist")
            return path
        local = None if local_dir is None else str(Path(local_dir).expanduser() / name)
        if local is None and repo_id is None:
            raise WeightsError(f"EAGLE head file {name}: set model.eagle_head_repo (a Hugging Face repo) or "
                               "model.local_dir, or give a path")
        return resolve(repo_id or "(local)", name, local, cache_dir)

    path = find(names[0]) if len(names) == 1 else _first_found(names, find)
    if path.suffix == ".safetensors" and has_head_metadata(path):
        head = load_trained(path)
    else:
        if not config_file:
            what = f"{path} is a LANTERN head file"
            if path.suffix == ".safetensors":
                what = (f"{path} has no '{HEAD_META}' metadata (not a head written by python -m "
                        "baselines.training.train_eagle), so it is read as LANTERN's release "
                        "(model.safetensors or pytorch_model.bin)")
            raise WeightsError(f"{what}: set model.eagle_head_config (its config.json)")
        head = load_lantern(find(config_file), path, trust_pickle, target_cfg, vocab_ids)
    check_compatible(head.cfg, target_cfg, str(path))
    log.info("loaded the EAGLE head %s", path)
    return head


def _first_found(names: Sequence[str], find: Any) -> Path:
    """`find(name)` of the first of `names` that is found (each WeightsError: try the next); the last
    error, naming every name tried, when none is."""
    errors = []
    for name in names:
        try:
            return find(name)
        except WeightsError as err:
            errors.append(f"{name}: {err}")
    raise WeightsError(f"no EAGLE head file of {names} was found, tried in that order ({'; '.join(errors)})")


def head_spec(target: Any) -> "GPTConfig | TargetSpec":
    """What a head for `target` must match: its `head_spec` (Lumina-mGPT, Janus-Pro, Emu3) or its
    GPT's config (the project's GPT: LlamaGen, Tar, shapes, random)."""
    spec = getattr(target, "head_spec", None)
    return spec if spec is not None else target.gpt.cfg


def attach_head(target: Any, dtype: torch.dtype, **where: Any) -> None:
    """Build the EAGLE head of a target (an OfficialImageModel, or a backbone with `head_spec`) with
    `build_head(**where)` and attach it as `target.eagle_head` in `dtype` (the loaders of LlamaGen,
    Tar, Lumina-mGPT, Janus-Pro and Emu3)."""
    with torch.no_grad():
        embeddings = target.token_embeddings.detach().float().cpu()
    head = build_head(head_spec(target), embeddings, vocab_ids=getattr(target, "code_ids", None), **where)
    target.eagle_head = head.to(dtype)
