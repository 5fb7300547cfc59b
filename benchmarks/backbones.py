"""Full-size backbones on the CPU: the real layout of each backbone the field reports on, its weight
and KV-cache bytes, and the wall time of one random-weight forward, measured at a few layers and
scaled to the full depth.

    python benchmarks/backbones.py [--models lumina_mgpt_512,lumina_mgpt_768,lumina_mgpt_1024,janus_pro_1b,janus_pro_7b,emu3_gen]
                                   [--layers 1] [--dtype bf16] [--threads 1] [--repeats 1] [--small]

Each model is built at its released width with random weights, no files and no network, with
2N decoder layers (N = `--layers`):

* Lumina-mGPT 7B (512 / 768 / 1024 px): the Chameleon LM of `model.random_init` (conf/model
  `arch`, whose defaults are the 7B's, harness/models/lumina/chameleon.ChameleonArch);
* Janus-Pro 1B / 7B and Emu3-Gen: transformers' models from the stand-ins' `arch.released` sizes
  (harness/models/janus/tiny.py, harness/models/emu3/tiny.py, which cite where each size comes
  from). Their understanding tower and VQ convolutions stay tiny: only the language model and the
  image path's embedding and head are timed and counted.

Per model, two tables:

1. The layout check: width, depth, heads, key/value heads, the LM vocabulary, the image codes
   (the logits a step draws from), the token grid, the condition slots (prompt slots and image
   header) and the sequence of a full image (condition + grid + the end-of-row tokens between rows
   where the backbone has them: Lumina-mGPT, Emu3); the full-depth weight bytes (one decoder
   layer x the released depth + everything outside the layers; the LM parts only) and the KV cache
   of that sequence at batch 1 with CFG (2 rows).
2. Two forwards, 2 rows (batch 1 with CFG), timed at N and 2N layers and scaled to the full depth L
   by t(L) = t(N) + (L - N) / N * (t(2N) - t(N)) (the layers' share grows linearly, embeddings and
   head are paid once): (a) one whole-sequence forward over every slot of a full image (prefill and
   verify-everything at once, each slot writing its keys and values, an explicit causal mask, the
   image-code logits of every position from the last condition slot on: the widest forward a
   decoder runs); (b) one cached single-token decode step at the end of that sequence (a cache of
   the full sequence, one query). The FLOP columns count the matrix products (weights, dense masked
   attention, the image head) of the full depth.

The header gives the matrix-product rate of `--dtype` and of fp32 on this CPU: without native bf16
arithmetic (AVX2 only) bf16 products run tens of times slower than fp32 (a warning says so; use
`--dtype fp32` there).

`--small` shrinks width, grid and prompt slots (tests; the layouts are then not the released ones).
This is a microbenchmark of single forwards with random weights, not a timing of decoders (those
come from the harness pipeline, harness/generate.py).
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import CONF, header  # noqa: E402
from harness.models.emu3 import tiny as emu3_tiny  # noqa: E402
from harness.models.emu3.prompts import TinyPromptTokenizer  # noqa: E402
from harness.models.hub import dtype_of  # noqa: E402
from harness.models.janus import tiny as janus_tiny  # noqa: E402
from harness.models.llama_layers import rotary, run_layers  # noqa: E402
from harness.models.lumina.chameleon import ChameleonArch, ChameleonLM  # noqa: E402
from harness.models.lumina.layout import HEADER, SpecialTokens  # noqa: E402
from harness.models.lumina.vqgan import VQGANConfig  # noqa: E402
from harness.models.masks import attention_mask  # noqa: E402
from harness.models.transformer import KVCache  # noqa: E402
from harness.store.summary import _markdown  # noqa: E402

log = logging.getLogger("benchmarks.backbones")
MODELS = ("lumina_mgpt_512", "lumina_mgpt_768", "lumina_mgpt_1024", "janus_pro_1b", "janus_pro_7b", "emu3_gen")
ROWS = 2  # batch 1 with classifier-free guidance
SMALL = {"hidden": 64, "heads": 4, "mlp": 128, "grid": 4, "prompt_slots": 8}  # `--small`: a few-second scale


@dataclass(frozen=True)
class Layout:
    """What a backbone is at full size: its sizes and the sequence of one full image."""

    name: str
    hidden: int
    layers: int  # the released depth L
    heads: int
    kv_heads: int
    mlp: int
    vocab: int  # LM vocabulary (input embedding rows)
    codes: int  # image codes: the logits of an image step
    grid: tuple[int, int]  # token rows, cols
    prefix: int  # condition slots: prompt slots + image header
    row_ends: bool  # an end-of-row token closes every row but the last

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def n_tokens(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def seq(self) -> int:
        """Slots of a full image: condition, grid tokens, the end-of-row tokens between rows."""
        return self.prefix + self.n_tokens + (self.grid[0] - 1 if self.row_ends else 0)

    def kv_bytes(self, rows: int, element: int) -> int:
        """Keys and values of every layer over the full sequence, `rows` rows."""
        return 2 * rows * self.layers * self.kv_heads * self.head_dim * self.seq * element


def _conf(name: str) -> Any:
    path = CONF / "model" / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"--models: no conf/model/{name}.yaml; choose from {', '.join(MODELS)}")
    return OmegaConf.load(path)


def _shrunk(sizes: dict[str, int], small: bool) -> dict[str, int]:
    """`sizes` with SMALL's width (key/value heads in the released ratio) when `small`."""
    if not small:
        return sizes
    group = sizes["heads"] // sizes["kv_heads"]
    return {**sizes, "hidden": SMALL["hidden"], "heads": SMALL["heads"], "kv_heads": max(1, SMALL["heads"] // group),
            "mlp": SMALL["mlp"]}


def layout(name: str, small: bool = False) -> Layout:
    """The full-size layout of `model=name` (conf/model/<name>.yaml), or its `small` stand-in."""
    cfg = _conf(name)
    family = str(cfg._target_).split(".")[2]
    if family == "lumina":
        arch = ChameleonArch(**OmegaConf.to_container(cfg.arch))  # {} in the released configs: the 7B
        sizes = _shrunk({"hidden": arch.hidden_size, "heads": arch.num_attention_heads,
                         "kv_heads": arch.num_key_value_heads, "mlp": arch.intermediate_size}, small)
        side = (SMALL["grid"] if small else int(cfg.target_size) // VQGANConfig().downsample)
        slots = SMALL["prompt_slots"] if small else int(cfg.prompt_slots)
        return Layout(name, sizes["hidden"], arch.num_hidden_layers, sizes["heads"], sizes["kv_heads"], sizes["mlp"],
                      arch.vocab_size, SpecialTokens().codes, (side, side), slots + HEADER, True)
    if family == "janus":
        s = janus_tiny.base_sizes({"released": name})
        if s["grid"] != int(cfg.image_size) // 16 or s["codes"] != int(cfg.codebook_size):
            raise ValueError(f"conf/model/{name}.yaml (image_size, codebook_size) disagrees with the released sizes {s}")
        w = _shrunk(s, small)
        side = SMALL["grid"] if small else s["grid"]
        slots = SMALL["prompt_slots"] if small else int(cfg.prefix_len)
        return Layout(name, w["hidden"], s["layers"], w["heads"], w["kv_heads"], w["mlp"], s["vocab"], s["codes"],
                      (side, side), slots, False)
    if family == "emu3":
        s = emu3_tiny.RELEASED[name]
        w = _shrunk(s, small)
        side = SMALL["grid"] if small else int(cfg.target_size) // 8  # the VQ model's 8x downsampling
        slots = SMALL["prompt_slots"] if small else int(cfg.prompt_slots)
        # the header <|image start|>{rows}*{cols}<|image token|>, one token a digit (the stand-in
        # tokenizer's count; the released tokenizer's is read by the bundle, not here)
        head = len(TinyPromptTokenizer().header((side, side)))
        return Layout(name, w["hidden"], s["layers"], w["heads"], w["kv_heads"], w["mlp"],
                      emu3_tiny.FIRST_WORD + s["words"] + s["codes"], s["codes"], (side, side), slots + head, True)
    raise ValueError(f"--models: {name} is not a Lumina-mGPT, Janus-Pro or Emu3 backbone; choose from {', '.join(MODELS)}")


class Backbone:
    """The language model of one layout at `depth` of its built layers, with a static KV cache.

    `run(ids, positions, mask, write, prompt, project_from)`: ids [B, T] (the first `prompt` of them
    condition tokens, the rest image tokens) at rotary positions [B, T], writing cache slots write
    [B, T] under mask [B, T, S] bool -> the image-code logits [B, T - project_from, codes] of the
    positions from `project_from`. `setup(rows, slots)`: a zeroed cache. `parts`: the modules whose
    weights are counted; `head_params`: the weights an image position's logits read after the final
    norm; `keep`: what must outlive the call (the transformers model)."""

    def __init__(self, lay: Layout, parts: nn.Module, layers: nn.ModuleList, run: Callable[..., Tensor],
                 setup: Callable[[int, int], None], head_params: int, keep: Any = None) -> None:
        self.layout, self.parts, self.layers, self.run, self.setup = lay, parts, layers, run, setup
        self.head_params, self.keep = head_params, keep
        self.depth = len(layers)

    def weight_bytes(self) -> int:
        """Full-depth bytes: one layer's x the released depth + everything outside the layers."""
        per_layer = _bytes(self.layers[0])
        return _bytes(self.parts) - len(self.layers) * per_layer + self.layout.layers * per_layer

    def weight_count(self) -> int:
        """Full-depth parameter count, as `weight_bytes`."""
        per_layer = self.layer_params()
        return _count(self.parts) - len(self.layers) * per_layer + self.layout.layers * per_layer

    def layer_params(self) -> int:
        return _count(self.layers[0])


def _bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _lumina(lay: Layout, layers: int, dtype: torch.dtype) -> Backbone:
    arch = ChameleonArch(hidden_size=lay.hidden, intermediate_size=lay.mlp, num_attention_heads=lay.heads,
                         num_key_value_heads=lay.kv_heads, num_hidden_layers=layers, vocab_size=lay.vocab)
    lm = ChameleonLM(arch).eval().to(dtype)
    every = lm.model.layers
    rows = torch.arange(lay.codes) + SpecialTokens().first_code  # the image codes' vocabulary ids

    def run(ids: Tensor, positions: Tensor, mask: Tensor, write: Tensor, prompt: int, project_from: int) -> Tensor:
        lm.model.layers = every[:backbone.depth]
        try:
            hidden = lm.hidden(ids, positions, mask, write)
        finally:
            lm.model.layers = every
        return lm.logits(hidden[:, project_from:], rows)

    backbone = Backbone(lay, lm, every, run, lm.setup_cache, lay.codes * lay.hidden)
    return backbone


def _llama(lay: Layout, hf: nn.Module, text: nn.Module, parts: nn.Module, family: str,
           embed: Callable[[Tensor, int], Tensor], head: Callable[[Tensor], Tensor], head_params: int) -> Backbone:
    """A transformers Llama-style text model (`text`: embed_tokens, layers, norm, rotary_emb) run
    through the harness's cached layer loop (harness/models/llama_layers.py)."""
    rope = rotary(family)
    caches: list[KVCache | None] = [None] * len(text.layers)

    def run(ids: Tensor, positions: Tensor, mask: Tensor, write: Tensor, prompt: int, project_from: int) -> Tensor:
        x = embed(ids, prompt)
        cos, sin = text.rotary_emb(x, positions)
        d = backbone.depth
        h = run_layers(text.layers[:d], caches[:d], x, cos, sin, mask, write, (lay.heads, lay.kv_heads, lay.head_dim),
                       rope)
        return head(text.norm(h[:, project_from:]))

    def setup(n: int, slots: int) -> None:
        caches[:] = [KVCache.reuse(c, n, lay.kv_heads, slots, lay.head_dim, text.norm.weight.dtype, torch.device("cpu"))
                     for c in caches]

    backbone = Backbone(lay, parts, text.layers, run, setup, head_params, keep=hf)
    return backbone


def _janus(lay: Layout, layers: int, dtype: torch.dtype) -> Backbone:
    arch = {"released": lay.name, "layers": layers, "hidden": lay.hidden, "heads": lay.heads,
            "kv_heads": lay.kv_heads, "mlp": lay.mlp, "grid": lay.grid[0]}
    hf = janus_tiny.tiny_model(arch, seed=0).to(dtype)
    m = hf.model
    text = m.language_model

    def embed(ids: Tensor, prompt: int) -> Tensor:
        """Prompt ids through the text embedding, image codes through the generation path."""
        image = hf.prepare_embeddings_for_image_generation(ids[:, prompt:])
        return torch.cat([text.embed_tokens(ids[:, :prompt]), image], 1) if prompt else image

    parts = nn.ModuleList([text, m.generation_embeddings, m.generation_aligner, m.generation_head, hf.lm_head])
    return _llama(lay, hf, text, parts, "llama", embed, m.generation_head, _count(m.generation_head))


def _emu3(lay: Layout, layers: int, dtype: torch.dtype) -> Backbone:
    words = lay.vocab - emu3_tiny.FIRST_WORD - lay.codes
    arch = {"released": lay.name, "layers": layers, "hidden": lay.hidden, "heads": lay.heads,
            "kv_heads": lay.kv_heads, "mlp": lay.mlp, "words": words}
    hf = emu3_tiny.tiny_model(arch, seed=0).to(dtype)
    text = hf.model.text_model
    codes = torch.tensor([hf.vocabulary_mapping.img2bpe[c] for c in range(lay.codes)])
    rows = hf.lm_head.weight[codes].detach()  # the head's image-code rows, sliced once (as Emu3ImageModel)

    def embed(ids: Tensor, prompt: int) -> Tensor:
        return text.embed_tokens(ids)

    def head(hidden: Tensor) -> Tensor:
        return F.linear(hidden, rows).float()

    parts = nn.ModuleList([text, hf.lm_head])
    return _llama(lay, hf, text, parts, "emu3", embed, head, lay.codes * lay.hidden)


def build(lay: Layout, layers: int, dtype: torch.dtype) -> Backbone:
    """A random-weight backbone of `lay` with `layers` decoder layers, on the CPU."""
    family = str(_conf(lay.name)._target_).split(".")[2]
    maker = {"lumina": _lumina, "janus": _janus, "emu3": _emu3}[family]
    torch.manual_seed(0)
    return maker(lay, layers, dtype)


def released_weights(name: str, dtype: str = "bf16") -> tuple[int, int]:
    """(parameters, bytes) of the full-depth language model of `name` (as `measure` reports them),
    counted on the meta device from one built layer: no memory, no compute."""
    with torch.device("meta"):
        backbone = build(layout(name), 1, dtype_of(dtype))
    return backbone.weight_count(), backbone.weight_bytes()


@torch.inference_mode()
def _time(backbone: Backbone, depth: int, whole: bool, repeats: int) -> float:
    """Seconds of the fastest of `repeats` forwards at `depth` layers: the whole sequence, or the
    decode step at its end."""
    lay = backbone.layout
    s = lay.seq
    backbone.depth = depth
    backbone.setup(ROWS, s)
    g = torch.Generator().manual_seed(0)
    if whole:
        slots = torch.arange(s)
        ids = torch.cat([torch.randint(lay.vocab, (ROWS, lay.prefix), generator=g),
                         torch.randint(lay.codes, (ROWS, s - lay.prefix), generator=g)], 1)
        mask = attention_mask(slots, s).expand(ROWS, -1, -1)
        args = (ids, slots.expand(ROWS, -1), mask, slots.expand(ROWS, -1), lay.prefix, lay.prefix - 1)
    else:
        last = torch.full((ROWS, 1), s - 1)
        ids = torch.randint(lay.codes, (ROWS, 1), generator=g)
        args = (ids, last, torch.ones(ROWS, 1, s, dtype=torch.bool), last, 0, 0)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        backbone.run(*args)
        best = min(best, time.perf_counter() - start)
    return best


def scaled(t_n: float, t_2n: float, n: int, full: int) -> float:
    """t(L) = t(N) + (L - N) / N * (t(2N) - t(N)): the time of N more layers, linear in the depth."""
    return t_n + (full - n) / n * (t_2n - t_n)


def flops(lay: Layout, layer_params: int, head_params: int, whole: bool) -> float:
    """Matrix-product FLOPs of one forward at the full depth, ROWS rows: weights (2 per weight per
    token), dense masked attention (QK^T and AV over every key slot) and the image head."""
    queries = lay.seq if whole else 1
    projected = lay.seq - lay.prefix + 1 if whole else 1
    weights = 2 * ROWS * queries * lay.layers * layer_params
    attention = 4 * ROWS * lay.layers * lay.heads * lay.head_dim * queries * lay.seq
    return float(weights + attention + 2 * ROWS * projected * head_params)


def measure(name: str, layers: int = 1, dtype: str = "bf16", repeats: int = 1, small: bool = False) -> dict[str, Any]:
    """The layout rows and the timings of one model (see the module docstring)."""
    lay = layout(name, small)
    if layers < 1 or 2 * layers > lay.layers:
        raise ValueError(f"--layers {layers}: {name} has {lay.layers} layers; N and 2N layers are built, "
                         f"so N must be in 1..{lay.layers // 2}")
    torch_dtype = dtype_of(dtype)
    log.info("%s: building %d layers at width %d (%s)", name, 2 * layers, lay.hidden, dtype)
    backbone = build(lay, 2 * layers, torch_dtype)
    element = torch.finfo(torch_dtype).bits // 8
    out: dict[str, Any] = {"layout": lay, "weight_bytes": backbone.weight_bytes(), "weights": backbone.weight_count(),
                           "kv_bytes": lay.kv_bytes(ROWS, element), "n": layers}
    for kind, whole in (("whole", True), ("decode", False)):
        t_n = _time(backbone, layers, whole, repeats)
        t_2n = _time(backbone, 2 * layers, whole, repeats)
        out[kind] = (t_n, t_2n, scaled(t_n, t_2n, layers, lay.layers))
        out[f"{kind}_flops"] = flops(lay, backbone.layer_params(), backbone.head_params, whole)
        log.info("%s %s: %.3f s at %d layers, %.3f s at %d, %.3f s at %d (scaled)", name, kind, t_n, layers, t_2n,
                 2 * layers, out[kind][2], lay.layers)
    return out


def gemm_rate(dtype: torch.dtype, size: int = 1024, tokens: int = 128) -> float:
    """GFLOP/s of a [tokens, size] x [size, size] matrix product in `dtype` on this CPU (the best of
    three): a CPU without native bf16 / fp16 arithmetic runs these dtypes far below fp32."""
    x, w = torch.randn(tokens, size).to(dtype), torch.randn(size, size).to(dtype)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        x @ w
        best = min(best, time.perf_counter() - start)
    return 2 * tokens * size * size / best / 1e9


def layout_table(results: list[dict[str, Any]]) -> list[list[str]]:
    head = ["model", "width", "layers", "heads (kv)", "head dim", "MLP", "LM vocab", "image codes", "grid",
            "condition slots", "row ends", "sequence", "weights GB", "params (B)", "KV GB (2 rows)"]
    rows = [head]
    for r in results:
        lay: Layout = r["layout"]
        rows.append([lay.name, str(lay.hidden), str(lay.layers), f"{lay.heads} ({lay.kv_heads})", str(lay.head_dim),
                     str(lay.mlp), str(lay.vocab), str(lay.codes), f"{lay.grid[0]}x{lay.grid[1]}", str(lay.prefix),
                     str(lay.grid[0] - 1 if lay.row_ends else 0), str(lay.seq), f"{r['weight_bytes'] / 1e9:.2f}",
                     f"{r['weights'] / 1e9:.3f}", f"{r['kv_bytes'] / 1e9:.3f}"])
    return rows


def timing_table(results: list[dict[str, Any]]) -> list[list[str]]:
    n = results[0]["n"] if results else 1
    head = ["model", "whole TFLOP", f"whole s ({n} l)", f"whole s ({2 * n} l)", "whole s (full)",
            "decode GFLOP", f"decode ms ({n} l)", f"decode ms ({2 * n} l)", "decode ms (full)"]
    rows = [head]
    for r in results:
        w, d = r["whole"], r["decode"]
        rows.append([r["layout"].name, f"{r['whole_flops'] / 1e12:.2f}", *(f"{t:.2f}" for t in w),
                     f"{r['decode_flops'] / 1e9:.1f}", *(f"{1000 * t:.1f}" for t in d)])
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated conf/model names")
    ap.add_argument("--layers", type=int, default=1, help="N: timed at N and 2N decoder layers, scaled to the full depth")
    ap.add_argument("--dtype", default="bf16", help="bf16 | fp16 | fp32")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--repeats", type=int, default=1, help="forwards per timing; the fastest is kept")
    ap.add_argument("--small", action="store_true", help="tiny width, grid and prompt slots (tests)")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {a.repeats}")
    names = [n for n in a.models.split(",") if n]
    rate, fp32 = gemm_rate(dtype_of(a.dtype)), gemm_rate(torch.float32)
    print(header(models=",".join(names), layers=a.layers, dtype=a.dtype, threads=torch.get_num_threads(), rows=ROWS,
                 repeats=a.repeats, small=a.small, cpu=torch.backends.cpu.get_cpu_capability(),
                 gemm_gflops=f"{a.dtype}:{rate:.1f},fp32:{fp32:.1f}"))
    if rate < fp32 / 4:
        log.warning("matrix products in %s run at %.1f GFLOP/s here, fp32 at %.1f: this CPU has no fast %s path; "
                    "whole-sequence forwards will take far longer than in fp32 (--dtype fp32)", a.dtype, rate, fp32,
                    a.dtype)
    results = [measure(name, a.layers, a.dtype, a.repeats, a.small) for name in names]
    print("\n### layouts (full depth; weights: the language model and the image path's embedding and head)\n")
    table = layout_table(results)
    print(_markdown(table[0], table[1:], 1))
    print(f"\n### one forward, {ROWS} rows (batch 1 with CFG), scaled to the full depth: "
          "t(L) = t(N) + (L - N) / N * (t(2N) - t(N))\n")
    table = timing_table(results)
    print(_markdown(table[0], table[1:], 1))
    return results


if __name__ == "__main__":
    main()
