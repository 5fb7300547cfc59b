"""Stand-in repositories and mirrored files for the rehearsal: the official repo ids, file names and
formats, at tiny sizes.

`build(root, shared_data)` writes `<root>/hub/<org>/<name>/...` (served by tests/rehearsal/hub.py
as a model hub) and `<root>/mirror/<host>/<path>` (the `assets.mirror` layout), and returns the
overrides that shrink the real model configs to the stand-ins' architecture (`OVERRIDES`). The
architectures of the open_clip models the evaluators name (ViT-L-14, ViT-H-14) are registered at
tiny sizes under those names by tests/rehearsal/site/sitecustomize.py.
"""
from __future__ import annotations

import hashlib
import io
import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from tests.conftest import compose_cfg

# the real model configs shrunk to the stand-ins (the files keep their official names)
OVERRIDES = {
    "llamagen_xl_512": [
        "model.arch.dim=64", "model.arch.n_layer=2", "model.arch.n_head=4", "model.arch.caption_dim=32",
        "model.arch.vocab_size=256", "+model.arch.multiple_of=32",
        "+model.vq.codebook_size=256", "+model.vq.base_channels=32", "+model.vq.z_channels=32", "model.dtype=fp32",
    ],
    "tar_1.5b_512": [
        "model.arch.dim=64", "model.arch.n_layer=2", "model.arch.n_head=4", "model.arch.cond_dim=32",
        "model.arch.prefix_len=9", "model.arch.vocab_size=256", "+model.arch.multiple_of=32",
        "+model.tatok.codebook_size=512", "+model.tatok.bottleneck_dim=16", "+model.tatok.hidden=32",
        "+model.tatok.layers=1", "+model.tatok.heads=2", "+model.tatok.mlp=64", "+model.tatok.pos_table=16",
        "+model.vq.codebook_size=256", "+model.vq.base_channels=32", "+model.vq.z_channels=32", "model.dtype=fp32",
    ],
}
CODES = 512  # TA-Tok codebook of the stand-in
GENERATION_TOP_K, GENERATION_PENALTY = 20, 1.1  # the stand-in Tar LLM's generation_config.json
STANDIN_PINS = "standin_pins.json"  # beside mirror/: url -> sha256 of the stand-in served for a pinned file


def build(root: Path, shared_data: Path) -> None:
    """Write every stand-in repository and mirrored file below `root`."""
    hub = root / "hub"
    _llamagen(hub)
    _tar(hub)
    _flan_t5(hub / "google" / "flan-t5-xl")
    tar_llm(hub / "csuhan" / "Tar-1.5B")
    _open_clip(hub)
    _mask2former(hub / "facebook" / "mask2former-swin-small-coco-instance")
    _blip(hub / "Salesforce" / "blip-vqa-base")
    pins = _mirror(root / "mirror", shared_data)
    from evaluators.hpsv2 import hub_pin

    hps = hub_pin("HPS_v2.1_compressed.pt")  # the stand-in checkpoint's hash in place of the real one's
    pins[hps.url] = hashlib.sha256((hub / "xswu" / "HPSv2" / hps.name).read_bytes()).hexdigest()
    (root / STANDIN_PINS).write_text(json.dumps(pins, indent=1))


def _tiny_bundle(model: str, extra: list[str]):
    from harness.run import _build

    cfg = compose_cfg([f"model={model}", *extra])
    return cfg, _build(cfg.model, drop=("name", "sampling"))


def _llamagen(hub: Path) -> None:
    """LlamaGen's three .pt files ({'model': state_dict}) and LANTERN's head (config.json +
    pytorch_model.bin) for a 512 px target (32x32 grid, 120 caption slots) at tiny width."""
    from tests.test_eagle import LANTERN_T2I2

    _, bundle = _tiny_bundle("llamagen_tiny", ["model.target_size=512", "model.drafter_size=256",
                                               "model.arch.prefix_len=120", "model.small_drafter_file=null"])
    repo = _folder(hub / "peizesun" / "llamagen_t2i")
    torch.save({"model": bundle.target.gpt.state_dict()}, repo / "t2i_XL_stage2_512.pt")
    torch.save({"model": bundle.drafter.gpt.state_dict()}, repo / "t2i_XL_stage1_256.pt")
    torch.save({"model": bundle.target.tokenizer.state_dict()}, repo / "vq_ds16_t2i.pt")
    (repo / "t2i_XL_stage1_512.pt").write_bytes(b"not read by any job")  # a file fetch must leave alone
    head = bundle.eagle_head
    config = {**LANTERN_T2I2, "hidden_size": head.cfg.dim, "num_attention_heads": head.cfg.n_head,
              "num_key_value_heads": head.cfg.n_kv_head, "intermediate_size": head.cfg.ffn_dim,
              "vocab_size": head.cfg.vocab_size, "caption_dim": 32}
    drafter = _folder(hub / "jadohu" / "llamagen2_drafter")
    (drafter / "config.json").write_text(json.dumps(config))
    torch.save(head.state_dict(), drafter / "pytorch_model.bin")


def _tar(hub: Path) -> None:
    """Tar's AR-DTok and TA-Tok files ({'model': {'name', 'args', 'sd'}}) at tiny width."""
    from tests.test_tar import _ar_file

    cfg, bundle = _tiny_bundle("tar_tiny", ["model.target_size=512", "model.drafter_size=256",
                                            "model.small_drafter_file=null", "model.eagle_head_file=null"])
    repo = _folder(hub / "csuhan" / "TA-Tok")
    torch.save(_ar_file(bundle.target.gpt), repo / "ar_dtok_lp_512px.pth")
    torch.save(_ar_file(bundle.drafter.gpt), repo / "ar_dtok_lp_256px.pth")
    tatok = bundle.conditioner.tatok
    regularizer = {"name": "simvq", "args": {"codebook_size": tatok.cfg.codebook_size, "l2_normalized": True}}
    bottleneck = {"bottleneck_dim": tatok.cfg.bottleneck_dim, "regularizer": regularizer}
    args = {"bottleneck": {"name": "bottleneck", "args": bottleneck}, "decoder_depth": tatok.cfg.layers}
    torch.save({"model": {"args": args, "sd": dict(tatok.state_dict())}}, repo / "ta_tok.pth")


def _flan_t5(repo: Path) -> None:
    """A 1-layer T5 encoder of width 32 with a word-level tokenizer, saved as transformers does, plus
    the weight formats the loader must not download (.bin, TF, Flax)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, T5Config, T5EncoderModel

    words = ["<pad>", "</s>", "<unk>", *sorted({w for w in _VOCAB.split()})]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    torch.manual_seed(0)
    config = T5Config(vocab_size=len(words), d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4,
                      feed_forward_proj="gated-gelu", pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    T5EncoderModel(config).save_pretrained(_folder(repo))
    fast.save_pretrained(repo)
    for decoy in ("pytorch_model.bin", "tf_model.h5", "flax_model.msgpack"):
        (repo / decoy).write_bytes(b"another weight format: never downloaded")


def tar_llm(repo: Path) -> None:
    """A 1-layer Qwen2 whose vocabulary holds Tar's `<I...>` code tokens, a chat template, weights."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<im_start>", "<S0>"]
    codes = [f"<I{i}>" for i in range(CODES)]
    words = [*specials, *codes, "<unk>", *sorted({w for w in _VOCAB.split()}), "system", "user", "assistant"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(specials + codes)
    template = ("{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
                "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   unk_token="<unk>", chat_template=template)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(words), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                         eos_token_id=words.index("<|im_end|>"), pad_token_id=0)
    model = Qwen2ForCausalLM(config)
    # sampling defaults of the kind Qwen2.5-Instruct ships (top-k 20, repetition penalty 1.1): they must
    # reach the LLM's sampling (tests/test_tar_llm_batched.py)
    model.generation_config.update(do_sample=True, top_k=GENERATION_TOP_K, repetition_penalty=GENERATION_PENALTY)
    model.save_pretrained(_folder(repo))
    fast.save_pretrained(repo)


def _open_clip(hub: Path) -> None:
    """open_clip's ViT-L-14 "openai" file (safetensors) and HPSv2's v2.1 checkpoint, for the tiny
    architectures sitecustomize.py registers under those names."""
    import open_clip
    from safetensors.torch import save_file

    from tests.rehearsal.site.sitecustomize import register

    register()
    torch.manual_seed(0)
    clip = open_clip.create_model("ViT-L-14", pretrained=None)
    repo = _folder(hub / "timm" / "vit_large_patch14_clip_224.openai")
    save_file({k: v.contiguous() for k, v in clip.state_dict().items()}, str(repo / "open_clip_model.safetensors"))
    (repo / "open_clip_pytorch_model.bin").write_bytes(b"the .bin copy: open_clip reads the safetensors one")
    hps = open_clip.create_model("ViT-H-14", pretrained=None)
    torch.save({"state_dict": hps.state_dict()}, _folder(hub / "xswu" / "HPSv2") / "HPS_v2.1_compressed.pt")


def _mask2former(repo: Path) -> None:
    """A tiny Mask2Former (Swin backbone) with GenEval's 80 COCO labels, saved as transformers does."""
    from transformers import Mask2FormerConfig, Mask2FormerForUniversalSegmentation, Mask2FormerImageProcessor
    from transformers import SwinConfig

    backbone = SwinConfig(image_size=64, patch_size=4, embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1],
                          window_size=4, out_features=["stage1", "stage2", "stage3", "stage4"])
    config = Mask2FormerConfig(backbone_config=backbone, hidden_dim=32, mask_feature_size=32, feature_size=32,
                               num_queries=8, encoder_layers=1, decoder_layers=2, encoder_feedforward_dim=64,
                               dim_feedforward=64, num_attention_heads=2, num_labels=80,
                               id2label={i: f"class{i}" for i in range(80)})
    torch.manual_seed(0)
    Mask2FormerForUniversalSegmentation(config).save_pretrained(_folder(repo))
    Mask2FormerImageProcessor(size={"shortest_edge": 64, "longest_edge": 64}).save_pretrained(repo)


def _blip(repo: Path) -> None:
    """A tiny BLIP VQA model with a BERT word-piece vocabulary, saved as transformers does."""
    from transformers import BertTokenizerFast, BlipConfig, BlipForQuestionAnswering, BlipImageProcessor
    from transformers import BlipProcessor

    folder = _folder(repo)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[DEC]", "yes", "no", *sorted(set(_VOCAB.split()))]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tokenizer = BertTokenizerFast(vocab_file=str(folder / "vocab.txt"), bos_token="[DEC]")
    processor = BlipProcessor(image_processor=BlipImageProcessor(size={"height": 32, "width": 32}),
                              tokenizer=tokenizer)
    text = {"vocab_size": len(vocab), "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
            "intermediate_size": 64, "encoder_hidden_size": 32, "bos_token_id": 5, "pad_token_id": 0,
            "sep_token_id": 3}
    vision = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
              "image_size": 32, "patch_size": 16}
    torch.manual_seed(0)
    BlipForQuestionAnswering(BlipConfig(text_config=text, vision_config=vision)).save_pretrained(folder)
    processor.save_pretrained(folder)


def _mirror(mirror: Path, shared: Path) -> dict[str, str]:
    """The non-hub files under <host>/<path>: the real prompt files (their pins must hold), a tiny
    val2017.zip of stand-in images, a stand-in GenEval detector checkpoint and stand-ins of MuLo-SD's
    pinned SR networks; returns the URL -> sha256 of the stand-ins served for pinned files."""
    from evaluators.fid_reference import COCO_VAL2017_ZIP
    from evaluators.geneval_detectors import MMDET_CHECKPOINT, OBJECT_NAMES
    from harness.datasets.official import COCO_CAPTIONS, DPG_PROMPT_URL, GENEVAL_METADATA

    def place(url: str, source: Path | bytes) -> None:
        target = mirror / url.split("://", 1)[1]
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(source, bytes):
            target.write_bytes(source)
        else:
            shutil.copyfile(source, target)

    place(COCO_CAPTIONS.url, shared / "coco" / "captions_val2017.json")
    place(GENEVAL_METADATA.url, shared / "geneval" / "evaluation_metadata.jsonl")
    place(OBJECT_NAMES.url, shared / "geneval" / "object_names.txt")
    for prompt in (shared / "dpg_bench" / "prompts").glob("*.txt"):
        place(DPG_PROMPT_URL.format(prompt.stem), prompt)
    standins = {COCO_VAL2017_ZIP.url: _val2017_zip(),
                MMDET_CHECKPOINT.url: b"a stand-in of the mmdet checkpoint (mmdet is not installed here)",
                **sr_networks()}
    for url, data in standins.items():  # pinned files: the harness runs check them against these hashes
        place(url, data)
    return {url: hashlib.sha256(data).hexdigest() for url, data in standins.items()}


def sr_networks() -> dict[str, bytes]:
    """URL -> bytes of a stand-in for each pinned Real-ESRGAN network (baselines/methods/sr_upsampler.py):
    a tiny compact SRVGG network of the same scale, saved as the releases are ({'params': state_dict}),
    which spandrel detects and loads strictly like the real RRDB files."""
    from baselines.methods.sr_upsampler import REALESRGAN
    from baselines.training.train_sr import compact

    found = {}
    for scale, pinned in REALESRGAN.items():
        torch.manual_seed(scale)
        buffer = io.BytesIO()
        torch.save({"params": compact(features=8, convs=2, scale=scale).state_dict()}, buffer)
        found[pinned.url] = buffer.getvalue()
    return found


def _val2017_zip(count: int = 6) -> bytes:
    """A zip shaped like COCO's val2017.zip (val2017/<id>.jpg) of `count` random images."""
    rng = np.random.default_rng(0)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for i in range(count):
            image = Image.fromarray(rng.integers(0, 256, (48 + 8 * i, 64, 3), dtype=np.uint8))
            data = io.BytesIO()
            image.save(data, format="JPEG")
            archive.writestr(f"val2017/{i:012d}.jpg", data.getvalue())
    return buffer.getvalue()


def _folder(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


_VOCAB = """a an the of on in with and to at by two three four red green blue yellow white black brown pink
purple orange cat dog car bus person table chair photo image picture cube sphere left right above below
near next is are there small large big""".replace("\n", " ")


def question_graph(path: Path, items: int = 4) -> Path:
    """A DPG-Bench-format question graph for the first `items` prompts (the official dpg_bench.csv is
    not on this machine, so its pinned download cannot be served). A dependency column holding
    "1,2" keeps it text when pandas reads it, as the official script needs."""
    import csv

    from tests.test_dpg_bench import HEADER
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(HEADER)
        for item in range(items):
            writer.writerow([item, "", "", 1, "0", "entity", "whole", "entity - whole (thing)", "Is there a thing?"])
            writer.writerow([item, "", "", 2, "1", "attribute", "color", "attribute - color (thing, red)",
                             "Is the thing red?"])
            writer.writerow([item, "", "", 3, "1,2", "relation", "spatial", "relation - spatial (thing, table, on)",
                             "Is the red thing on a table?"])  # as in the real graph, some rows name two parents
    return path
