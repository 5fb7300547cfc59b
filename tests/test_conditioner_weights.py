"""Weights fetched as the loaders read them: a text-encoder / LLM repo is fetched with one weight
format, the first its loader reads (safetensors, else .bin: transformers' order), never without
weights; a repo whose weights are only `.bin` is fetched whole and loads offline; a repo without
weights is refused by fetch. LANTERN's Lumina-mGPT head takes `pytorch_model.bin` before
`model.safetensors`, as LANTERN's loader does. Real HTTP: the local hub of the rehearsal
(tests/rehearsal/hub.py) serves the stand-in repos; the hub client runs in a subprocess, since it
reads HF_ENDPOINT and HF_HUB_OFFLINE when imported."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

transformers = pytest.importorskip("transformers")

WORDS = ["<pad>", "</s>", "<unk>", "a", "red", "cube", "on", "the", "table"]
PROBE = """
import json, sys
from omegaconf import OmegaConf
from harness.assets.fetching import conditioner_asset, fetch_assets
from harness.models.llamagen.t5_captions import FlanT5Encoder
repo, mode = sys.argv[1], sys.argv[2]
asset = conditioner_asset("model.text_encoder", OmegaConf.create(
    {"_target_": "harness.models.llamagen.t5_captions.FlanT5Encoder", "repo_id": repo}))
out = {}
if mode == "fetch":
    try:
        out["listed"] = sorted(e.name for item in fetch_assets([asset]) for e in item.entries)
    except Exception as err:
        out["error"] = f"{type(err).__name__}: {err}"
else:
    out["missing"] = asset.missing()
    encoder = FlanT5Encoder(repo_id=repo, dtype="fp32", clean=False)
    out["features"] = list(encoder(["a red cube"])[0].shape) if callable(encoder) else None
print(json.dumps(out))
"""


def _t5(repo: Path, safetensors: bool, bin_: bool) -> None:
    """A 1-layer T5 encoder with a word-level tokenizer in `repo`, its weights in the formats asked for."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, T5Config, T5EncoderModel

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    torch.manual_seed(0)
    model = T5EncoderModel(T5Config(vocab_size=len(WORDS), d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=4,
                                    pad_token_id=0, eos_token_id=1, decoder_start_token_id=0))
    repo.mkdir(parents=True)
    model.config.save_pretrained(repo)
    if safetensors:
        model.save_pretrained(repo)
    if bin_:  # the pickled format transformers reads when a repo has no safetensors
        torch.save(model.state_dict(), repo / "pytorch_model.bin")
    fast.save_pretrained(repo)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory):
    from tests.rehearsal.hub import serve

    root = tmp_path_factory.mktemp("hub")
    _t5(root / "hub" / "org" / "t5-bin", safetensors=False, bin_=True)
    _t5(root / "hub" / "org" / "t5-both", safetensors=True, bin_=True)
    _t5(root / "hub" / "org" / "t5-none", safetensors=False, bin_=False)
    server = serve(root)
    yield server
    server.shutdown()


def _probe(hub, home: Path, repo: str, mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update({"HF_HOME": str(home), "HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1", "PYTHONPATH": str(ROOT),
                "OMP_NUM_THREADS": "1"})
    if mode == "offline":
        env["HF_HUB_OFFLINE"] = "1"
    done = subprocess.run([sys.executable, "-c", PROBE, repo, mode], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # a hub client in a subprocess per step: ~10 s each
def test_a_repo_with_only_bin_weights_is_fetched_whole_and_loads_offline(hub, tmp_path: Path) -> None:
    got = _probe(hub, tmp_path, "org/t5-bin", "fetch")
    assert "pytorch_model.bin" in got.get("listed", []) and "config.json" in got["listed"], got
    cached = {p.name for p in (tmp_path / "hub").rglob("*") if p.is_file() or p.is_symlink()}
    assert "pytorch_model.bin" in cached
    offline = _probe(hub, tmp_path, "org/t5-bin", "offline")
    assert offline["missing"] == [] and offline["features"][-1] == 16


@pytest.mark.slow  # a hub client in a subprocess per step: ~10 s each
def test_a_repo_with_both_formats_brings_only_the_first_the_loader_reads(hub, tmp_path: Path) -> None:
    got = _probe(hub, tmp_path, "org/t5-both", "fetch")
    assert "model.safetensors" in got.get("listed", []) and "pytorch_model.bin" not in got["listed"], got
    cached = {p.name for p in (tmp_path / "hub").rglob("*") if p.is_file() or p.is_symlink()}
    assert "model.safetensors" in cached and "pytorch_model.bin" not in cached


@pytest.mark.slow  # a hub client in a subprocess per step: ~10 s each
def test_a_repo_without_weights_is_refused_by_fetch(hub, tmp_path: Path) -> None:
    got = _probe(hub, tmp_path, "org/t5-none", "fetch")
    assert "no weight file (*.safetensors, then *.bin" in got.get("error", ""), got
    assert "org/t5-none" in got["error"]


def test_lantern_lumina_head_is_read_in_lanterns_order(tmp_path: Path) -> None:
    """Both files in the head's folder: the first of the configured order is read; only the second
    present: it is read."""
    from harness.models.eagle_head import _first_found
    from harness.models.hub import WeightsError

    folder = tmp_path / "head"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"b")

    def find(name: str) -> Path:
        path = folder / name
        if not path.is_file():
            raise WeightsError(f"{path} does not exist")
        return path

    order = ["pytorch_model.bin", "model.safetensors"]
    assert _first_found(order, find).name == "model.safetensors"
    (folder / "pytorch_model.bin").write_bytes(b"a")
    assert _first_found(order, find).name == "pytorch_model.bin"
    (folder / "pytorch_model.bin").unlink()
    (folder / "model.safetensors").unlink()
    with pytest.raises(WeightsError, match=r"no EAGLE head file of \['pytorch_model.bin', 'model.safetensors'\]"):
        _first_found(order, find)
