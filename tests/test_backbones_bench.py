"""benchmarks/backbones.py: the released layouts and sizes it builds (counted on the meta device, no
full-size model in memory), and its forwards at the `--small` scale."""
from __future__ import annotations

import pytest

from benchmarks import backbones
from harness.models.emu3 import tiny as emu3_tiny
from harness.models.janus import tiny as janus_tiny
from tests.single_thread import single_thread  # noqa: F401  (autouse)

# (condition slots, grid side, sequence of a full image) from the official layouts: Lumina-mGPT's
# 256 prompt slots + <image-start> <height> <width>, a row of `side` codes closed by <eol> but the
# last; Janus-Pro's 256 prompt slots and 24x24 codes, no row ends; Emu3's 256 text slots + the header
# <|image start|>90*90<|image token|> (7 ids), 90x90 codes (720 px / 8) with 89 row ends.
LAYOUTS = {"lumina_mgpt_512": (259, 32, 259 + 32 * 32 + 31), "lumina_mgpt_768": (259, 48, 259 + 48 * 48 + 47),
           "lumina_mgpt_1024": (259, 64, 259 + 64 * 64 + 63), "janus_pro_1b": (256, 24, 256 + 576),
           "janus_pro_7b": (256, 24, 256 + 576), "emu3_gen": (263, 90, 263 + 90 * 90 + 89)}


def _llama_layer(hidden: int, heads: int, kv_heads: int, mlp: int) -> int:
    """Weights of one Llama-style layer: q, o [h, h]; k, v [h, kv * hd]; gate, up, down; two norms."""
    head_dim = hidden // heads
    return 2 * hidden * hidden + 2 * hidden * kv_heads * head_dim + 3 * hidden * mlp + 2 * hidden


@pytest.mark.parametrize("name", backbones.MODELS)
def test_released_layouts(name: str) -> None:
    lay = backbones.layout(name)
    prefix, side, seq = LAYOUTS[name]
    assert (lay.prefix, lay.grid, lay.seq) == (prefix, (side, side), seq)
    assert lay.head_dim == 128
    # KV cache of the full sequence at batch 1 with CFG, bf16
    assert lay.kv_bytes(2, 2) == 2 * 2 * lay.layers * lay.kv_heads * 128 * seq * 2


def test_lumina_mgpt_7b_is_seven_billion_parameters() -> None:
    count, size = backbones.released_weights("lumina_mgpt_768")
    assert count == pytest.approx(7.0e9, rel=0.01)
    assert size == 2 * count  # bf16


@pytest.mark.parametrize("name", ["janus_pro_1b", "janus_pro_7b", "emu3_gen"])
def test_released_sizes_reach_the_built_models(name: str) -> None:
    """The meta-built model's layers and embeddings are the cited sizes (harness/models/*/tiny.py)."""
    lay = backbones.layout(name)
    cited = janus_tiny.RELEASED[name] if name.startswith("janus") else emu3_tiny.RELEASED[name]
    assert (lay.hidden, lay.layers, lay.heads, lay.kv_heads, lay.mlp, lay.codes) == tuple(
        cited[k] for k in ("hidden", "layers", "heads", "kv_heads", "mlp", "codes"))
    layer = _llama_layer(lay.hidden, lay.heads, lay.kv_heads, lay.mlp)
    count, _ = backbones.released_weights(name)
    if name == "emu3_gen":
        assert lay.vocab == 184622 and lay.codes == 32768 and (lay.heads, lay.kv_heads) == (32, 8)
        outside = 2 * lay.vocab * lay.hidden + lay.hidden  # embeddings, LM head, final norm
    else:
        assert lay.vocab == 102400 and lay.codes == 16384
        # embeddings (the text LM head is tied to them), final norm, 8-dim code embeddings, the
        # aligner (8 -> h -> h) and the head (h -> h -> 16384), with biases
        h = lay.hidden
        outside = lay.vocab * h + h + lay.codes * 8 + (8 * h + h + h * h + h) + (h * h + h + h * lay.codes + lay.codes)
    assert count == lay.layers * layer + outside


def test_small_forwards_run_and_report(capsys: pytest.CaptureFixture[str]) -> None:
    names = ["lumina_mgpt_512", "janus_pro_1b", "emu3_gen"]
    results = backbones.main(["--small", "--models", ",".join(names), "--dtype", "fp32"])
    out = capsys.readouterr().out
    assert "### layouts" in out and "t(L) = t(N) + (L - N) / N * (t(2N) - t(N))" in out
    for name, r in zip(names, results):
        lay = r["layout"]
        assert lay.name == name and lay.grid == (4, 4) and lay.hidden == backbones.SMALL["hidden"]
        assert lay.seq == lay.prefix + 16 + (3 if lay.row_ends else 0)
        assert all(t > 0 for t in (*r["whole"][:2], *r["decode"][:2]))
        assert r["whole"][2] == pytest.approx(backbones.scaled(*r["whole"][:2], 1, lay.layers))
        assert r["whole_flops"] > r["decode_flops"] > 0
        assert f"| {name}" in out


def test_bad_depth_is_refused() -> None:
    with pytest.raises(ValueError, match="--layers 13"):
        backbones.measure("janus_pro_1b", layers=13, small=True)
    with pytest.raises(ValueError, match="--models"):
        backbones.layout("no_such_model")
