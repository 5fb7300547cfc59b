"""The official prompt sets: MS-COCO 2017 val 5k captions, GenEval, DPG-Bench, PartiPrompts.

Each loader is a `_target_` of a `conf/dataset/*.yaml` file and returns list[Prompt]. Files come
from a local path when one is given (hash-checked unless `verify=False`), else from the pinned
upstream commit through `harness.datasets.downloads` (hash-checked, cached; see that module for offline
nodes). Sharding and the harness-wide `dataset_limit` are applied by the harness
(`samples.plan`, `datasets.select`); `limit` here trims the list the same way.
"""
from __future__ import annotations

import csv
import hashlib
import json
import logging
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from harness.api import ConfigValueError, Prompt
from harness.datasets.prompts import PromptFileError, select
from harness.datasets.downloads import Pinned, cache_root, fetch, resolve
from harness.store.samples import write_atomic

log = logging.getLogger(__name__)

CAPTION_RULES = ("longest", "first", "random")

COCO_CAPTIONS = Pinned(
    name="captions_val2017.json",
    url="https://raw.githubusercontent.com/jadohu/LANTERN/3a56e451dd5ebfa1903d044f754c68c420de27a9/"
        "data/prompts/captions_val2017.json",
    sha256="afe3b30e403dd7f228e2373023abbd60042a6e10ec6874d3652df034d289ebb9",
    what="COCO 2017 val caption annotations (official file, as copied in LANTERN @3a56e45; also inside "
         "cocodataset.org annotations_trainval2017.zip)",
)
GENEVAL_METADATA = Pinned(
    name="geneval_evaluation_metadata.jsonl",
    url="https://raw.githubusercontent.com/djghosh13/geneval/af4902f24d3ca90ebbb446dd9891a59e0f82725f/"
        "prompts/evaluation_metadata.jsonl",
    git_sha1="efc21c7e639cd45554a1e44fac87157211f16d51",
    what="GenEval prompts/evaluation_metadata.jsonl @af4902f",
)
DPG_COMMIT = "3c228f1dc6c4d3cad0a47493816151a419f14db3"
DPG_QUESTIONS = Pinned(
    name="dpg_bench.csv",
    url=f"https://raw.githubusercontent.com/TencentQQGYLab/ELLA/{DPG_COMMIT}/dpg_bench/dpg_bench.csv",
    git_sha1="98457fc9901943f51ff9a30367250fc292533bed",
    what="DPG-Bench question graph dpg_bench/dpg_bench.csv @3c228f1",
)
DPG_PROMPT_URL = f"https://raw.githubusercontent.com/TencentQQGYLab/ELLA/{DPG_COMMIT}/dpg_bench/prompts/{{}}.txt"
# sha256 over the lines json.dumps([item_id, text]) + "\n" of the 1,065 prompt files, sorted by item_id
# (computed from the byte-identical copy of dpg_bench/prompts/ @3c228f1; see prompt_set_digest).
DPG_PROMPTS_DIGEST = "bec000a9a27b0f46c66a32414fb3bc0c4a1e71ecc1a8467a18a1a1d38612b279"
DPG_PROMPTS = 1065
GENEVAL_PROMPTS = 553
PARTI_PROMPTS_FILE = Pinned(
    name="PartiPrompts.tsv",
    url="https://raw.githubusercontent.com/google-research/parti/5a657978134374ce28973948331b319adef164bd/"
        "PartiPrompts.tsv",
    sha256="fab29e41bb512a169b56acab4cf2a41dcb675e285df2efcde6640c7dd3c440eb",
    what="PartiPrompts (P2) PartiPrompts.tsv @5a65797",
)
PARTI_HEADER = ("Prompt", "Category", "Challenge", "Note")
PARTI_PROMPTS = 1632


# ---------------------------------------------------------------------------------------------- COCO


def coco5k(captions: str | None = None, caption_rule: str = "longest", seed: int = 0,
           limit: int | None = None, verify: bool = True) -> list[Prompt]:
    """MS-COCO 2017 val: one caption for each of the 5,000 images.

    Args:
        captions: local `captions_val2017.json` (None: download the pinned copy).
        caption_rule: "longest" (LANTERN's list: longest caption, first on ties), "first" (lowest
            annotation id) or "random" (seeded by (seed, image_id), independent of order).
        seed: seed of the "random" rule.
        limit: keep the first N prompts.
        verify: check the local file's sha256.

    Order: images by first appearance in `annotations` (LANTERN's order). Prompt id
    "coco5k/<image_id>"; meta holds image_id, file_name, annotation_id, caption_rule.
    """
    if caption_rule not in CAPTION_RULES:
        raise ConfigValueError(f"dataset.caption_rule must be one of {CAPTION_RULES}, got {caption_rule!r}")
    path = resolve(COCO_CAPTIONS, captions, check=verify)
    data = _read_json(path)
    files = {img["id"]: img["file_name"] for img in data.get("images", [])}
    groups = caption_groups(data.get("annotations", []), path)
    prompts = []
    for image_id, anns in groups.items():
        ann = choose_caption(anns, caption_rule, seed, image_id)
        meta = {"image_id": image_id, "file_name": files.get(image_id, f"{image_id:012d}.jpg"),
                "annotation_id": ann["id"], "caption_rule": caption_rule}
        prompts.append(Prompt(id=f"coco5k/{image_id}", text=ann["caption"], meta=meta))
    log.info("coco5k: %d captions (rule %s) from %s", len(prompts), caption_rule, path)
    return select(prompts, limit)


def caption_groups(annotations: Iterable[dict[str, Any]], path: Path) -> "OrderedDict[int, list[dict]]":
    """Annotations grouped by image_id, images in order of first appearance, file order inside."""
    groups: OrderedDict[int, list[dict[str, Any]]] = OrderedDict()
    for index, ann in enumerate(annotations):
        if not (isinstance(ann, dict) and isinstance(ann.get("caption"), str)
                and isinstance(ann.get("image_id"), int) and isinstance(ann.get("id"), int)):
            raise PromptFileError(f"{path}: annotation #{index} needs int image_id, int id and a caption: {ann!r}")
        groups.setdefault(ann["image_id"], []).append(ann)
    if not groups:
        raise PromptFileError(f"{path} holds no caption annotations (expected COCO captions_*.json)")
    return groups


def choose_caption(anns: list[dict[str, Any]], rule: str, seed: int, image_id: int) -> dict[str, Any]:
    """One annotation of an image by `rule` (see coco5k)."""
    if rule == "longest":
        return max(anns, key=lambda a: len(a["caption"]))  # max keeps the first on ties
    ordered = sorted(anns, key=lambda a: a["id"])
    if rule == "first":
        return ordered[0]
    rng = np.random.default_rng([seed, image_id])
    return ordered[int(rng.integers(len(ordered)))]


# -------------------------------------------------------------------------------------------- GenEval


def geneval(metadata: str | None = None, limit: int | None = None, verify: bool = True) -> list[Prompt]:
    """GenEval's 553 prompts with their metadata (4 images per prompt by protocol).

    Args:
        metadata: local `evaluation_metadata.jsonl` (None: download the pinned file).
        limit: keep the first N prompts.
        verify: check the local file's git blob SHA-1 (off for custom prompt sets made with
            GenEval's create_prompts.py).

    Prompt id "geneval/<NNNNN>" (N = line index, the official image-folder name); meta = the
    metadata line (tag, include, [exclude], prompt).
    """
    path = resolve(GENEVAL_METADATA, metadata, check=verify)
    prompts = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            meta = _geneval_line(path, lineno, line)
            prompts.append(Prompt(id=f"geneval/{lineno - 1:05d}", text=meta["prompt"], meta=meta))
    if not prompts:
        raise PromptFileError(f"{path} holds no GenEval prompt")
    if verify and len(prompts) != GENEVAL_PROMPTS:
        log.warning("geneval: %s has %d prompts, the official set has %d", path, len(prompts), GENEVAL_PROMPTS)
    return select(prompts, limit)


def _geneval_line(path: Path, lineno: int, line: str) -> dict[str, Any]:
    """One metadata line, validated; PromptFileError names path:line."""
    try:
        meta = json.loads(line)
    except json.JSONDecodeError as err:
        raise PromptFileError(f"{path}:{lineno}: not valid JSON ({err.msg})") from err
    if not isinstance(meta, dict) or not isinstance(meta.get("prompt"), str) or not isinstance(meta.get("tag"), str):
        raise PromptFileError(f"{path}:{lineno}: a GenEval line needs string 'tag' and 'prompt'")
    for key in ("include", "exclude"):
        clauses = meta.get(key, [])
        if not isinstance(clauses, list) or not all(
                isinstance(c, dict) and isinstance(c.get("class"), str) and isinstance(c.get("count"), int)
                for c in clauses):
            raise PromptFileError(f"{path}:{lineno}: {key!r} must be a list of {{class, count}} clauses")
    if not meta.get("include"):
        raise PromptFileError(f"{path}:{lineno}: a GenEval line needs a non-empty 'include' list")
    return meta


# ------------------------------------------------------------------------------------------ DPG-Bench


def dpg_bench(prompts: str | None = None, questions: str | None = None, limit: int | None = None,
              verify: bool = True) -> list[Prompt]:
    """DPG-Bench's 1,065 prompts (4 images per prompt, scored as one 2x2 grid).

    Args:
        prompts: local `dpg_bench/prompts/` folder of `<item_id>.txt` files, or a `.jsonl` of
            {"item_id", "prompt"} (None: download the files at the pinned commit; the item ids
            come from the question graph).
        questions: local `dpg_bench.csv` (only read when prompts must be downloaded; the evaluator
            reads it for scoring).
        limit: keep the first N prompts.
        verify: check the prompt set against the pinned digest.

    Order: numeric item ids ascending, then the others by name. Prompt id "dpg_bench/<item_id>";
    meta {"item_id"}: the evaluator finds an item's questions by it.
    """
    if prompts is not None:
        items = read_dpg_prompts(Path(prompts).expanduser())
    else:
        items = _download_dpg_prompts(resolve(DPG_QUESTIONS, questions, check=verify))
    if verify:
        digest = prompt_set_digest(items)
        if digest != DPG_PROMPTS_DIGEST:
            raise PromptFileError(
                f"DPG-Bench prompts from {prompts or 'the download'} are not the official set ({len(items)} "
                f"prompts, digest {digest}, expected {DPG_PROMPTS} prompts with digest {DPG_PROMPTS_DIGEST}); "
                "use an unmodified copy of dpg_bench/prompts @3c228f1, or dataset.verify=false for a custom set"
            )
    out = [Prompt(id=f"dpg_bench/{item}", text=text, meta={"item_id": item})
           for item, text in sorted(items.items(), key=lambda kv: _dpg_order(kv[0]))]
    return select(out, limit)


def read_dpg_prompts(path: Path) -> dict[str, str]:
    """item_id -> exact prompt text from a folder of `<item_id>.txt` files or a jsonl file."""
    if path.is_dir():
        files = sorted(path.glob("*.txt"))
        if not files:
            raise PromptFileError(f"{path} holds no <item_id>.txt prompt files (expected dpg_bench/prompts/)")
        return {f.stem: f.read_bytes().decode("utf-8") for f in files}
    if not path.is_file():
        raise PromptFileError(f"DPG-Bench prompts {path} do not exist; give the dpg_bench/prompts/ folder "
                              "or a jsonl of {item_id, prompt}, or leave dataset.prompts unset to download")
    items: dict[str, str] = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise PromptFileError(f"{path}:{lineno}: not valid JSON ({err.msg})") from err
        if not (isinstance(row, dict) and isinstance(row.get("item_id"), str) and isinstance(row.get("prompt"), str)):
            raise PromptFileError(f"{path}:{lineno}: needs string fields 'item_id' and 'prompt'")
        if row["item_id"] in items:
            raise PromptFileError(f"{path}:{lineno}: item_id {row['item_id']!r} repeats")
        items[row["item_id"]] = row["prompt"]
    return items


def prompt_set_digest(items: dict[str, str]) -> str:
    """sha256 over json.dumps([item_id, text]) + newline, items sorted by item_id."""
    digest = hashlib.sha256()
    for item, text in sorted(items.items()):
        digest.update(json.dumps([item, text], ensure_ascii=False).encode("utf-8") + b"\n")
    return digest.hexdigest()


def _dpg_order(item: str) -> tuple[int, int, str]:
    """Numeric ids first (by value), then the rest by name."""
    return (0, int(item), "") if item.isdigit() else (1, 0, item)


def _download_dpg_prompts(questions_csv: Path) -> dict[str, str]:
    """Fetch every `<item_id>.txt` named in the question graph (cached as one jsonl)."""
    cached = cache_root() / "data" / f"dpg_bench_prompts_{DPG_COMMIT[:7]}.jsonl"
    if cached.is_file():
        return read_dpg_prompts(cached)
    with open(questions_csv, newline="", encoding="utf-8") as handle:
        ids = list(OrderedDict.fromkeys(row["item_id"] for row in csv.DictReader(handle)))
    from tqdm import tqdm

    items = {}
    for item in tqdm(ids, desc="dpg_bench prompts", unit="file"):
        pinned = Pinned(name=f"{item}.txt", url=DPG_PROMPT_URL.format(item), what=f"DPG-Bench prompt {item}")
        folder = cache_root() / "data" / f"dpg_bench_prompts_{DPG_COMMIT[:7]}"
        items[item] = fetch(pinned, cache_dir=folder).read_bytes().decode("utf-8")
    lines = "".join(json.dumps({"item_id": k, "prompt": v}, ensure_ascii=False) + "\n" for k, v in items.items())
    write_atomic(cached, lines.encode("utf-8"))
    return items


# --------------------------------------------------------------------------------------- PartiPrompts


def parti(path: str | None = None, limit: int | None = None, verify: bool = True) -> list[Prompt]:
    """PartiPrompts (Yu et al., 2022): 1,632 prompts over 12 categories and 11 challenge aspects.

    The prompt set on which SJD, SJD-PAC, GSD and SCD report their speed-ups; it has no reference
    images, so FID is not defined on it (CLIP score is).

    Args:
        path: local `PartiPrompts.tsv` (None: download the pinned copy).
        limit: keep the first N prompts.
        verify: check the local file's sha256 (off for an edited or extended prompt list in the
            same format).

    Order: file order. Prompt id "parti/<NNNNN>" (N = row index after the header); text = the
    Prompt column exactly as written (no CSV unquoting: a prompt that starts with a quote keeps it);
    meta {"category", "challenge", "note"}.
    """
    source = resolve(PARTI_PROMPTS_FILE, path, check=verify)
    prompts = [Prompt(id=f"parti/{index:05d}", text=text, meta=meta)
               for index, (text, meta) in enumerate(read_parti_rows(source))]
    if verify and len(prompts) != PARTI_PROMPTS:
        log.warning("parti: %s has %d prompts, the official set has %d", source, len(prompts), PARTI_PROMPTS)
    log.info("parti: %d prompts from %s", len(prompts), source)
    return select(prompts, limit)


def read_parti_rows(path: Path) -> list[tuple[str, dict[str, str]]]:
    """(prompt text, {category, challenge, note}) of every row of a PartiPrompts TSV file.

    Raises:
        PromptFileError: not UTF-8, a header other than PARTI_HEADER, a row without 4 tab-separated
            fields, an empty prompt, or no row at all; the message names path:line and the fix.
    """
    try:
        lines = path.read_bytes().decode("utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise PromptFileError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); use an "
                              "unmodified PartiPrompts.tsv") from err
    if not lines or tuple(lines[0].split("\t")) != PARTI_HEADER:
        found = lines[0][:80] if lines else "an empty file"
        raise PromptFileError(f"{path}:1: expected the PartiPrompts header, tab-separated "
                              f"{list(PARTI_HEADER)}, found {found!r}; give the PartiPrompts.tsv of "
                              "google-research/parti (or leave dataset.path unset to download it)")
    rows = []
    for lineno, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != len(PARTI_HEADER) or not fields[0].strip():
            raise PromptFileError(f"{path}:{lineno}: a PartiPrompts row needs {len(PARTI_HEADER)} tab-separated "
                                  f"fields {list(PARTI_HEADER)} with a non-empty Prompt, found "
                                  f"{len(fields)} fields: {line[:80]!r}")
        rows.append((fields[0], {"category": fields[1], "challenge": fields[2], "note": fields[3]}))
    if not rows:
        raise PromptFileError(f"{path} holds no PartiPrompts row after its header")
    return rows


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object from `path`; PromptFileError when unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise PromptFileError(f"{path} is not a readable JSON file ({err})") from err
    if not isinstance(data, dict):
        raise PromptFileError(f"{path}: expected a COCO annotation object, got {type(data).__name__}")
    return data
