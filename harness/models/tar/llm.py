"""Tar's first stage: a Qwen2.5 LLM (`csuhan/Tar-1.5B`, `csuhan/Tar-7B-v0.1`, through transformers,
imported lazily) emits TA-Tok codes for a prompt; `TarConditioner` turns them into AR-DTok
condition features. MuLo-SD does not touch this stage: the target and the drafter share its output
for an image (the harness times it as `condition_s`).

Prompting follows Tar's `t2i_inference.py` and evaluation scripts (`eval/eval_geneval.py`,
`eval/eval_dpg_bench.py`): the chat template (system "You are a helpful assistant.", the prompt as
the user turn, generation prompt) followed by `<im_start><S{scale}>`; codes are the `<I{n}>` tokens
of the output, truncated or zero-padded to `seq_len` (729 / 169 / 81 for scale 0 / 1 / 2).

Draws (`draws`): `per_image`, as Tar's evaluation scripts (the prompt repeated once per image, one
batched `generate` with only do_sample=True, temperature=1.0): every image gets its own LLM sample,
seeded from the image's seed (so from the run seed, the prompt id and the image index), drawn from
its own stream inside one batched `generate` (harness/models/tar/row_sampler.py);
`shared_per_prompt`: one sample per prompt (seeded from `seed` and the prompt text) shared by its
images, a tighter paired comparison; with `t2i_inference.py`'s top-p 0.95 / top-k 1200 it is the
stage as that script runs it. A null top_p / top_k keeps the checkpoint's generation config
(transformers' own defaults where it sets none), as the scripts do; the effective config
(`generation`, its difference from transformers' defaults) is logged, stored in run.json and names
the condition cache's entries.
"""
from __future__ import annotations

import hashlib
import logging
import re
from typing import Protocol, Sequence

import torch
from torch import Tensor

from harness.api import ConfigValueError
from harness.models.condition import TextCondition
from harness.models.hub import WEIGHT_ORDER, WeightsError, dtype_of, snapshot, weights_snapshot
from harness.models.tar.row_sampler import GREEDY, RowSampler, effective_config, generation_diff
from harness.models.tar.tatok import TATokCodeEmbedding

log = logging.getLogger(__name__)

_CODE = re.compile(r"<I(\d+)>")


DRAWS = ("per_image", "shared_per_prompt")


class CodeGenerator(Protocol):
    """prompts (one per image), the images' seeds or None -> TA-Tok codes [B, seq_len] int64."""

    seq_len: int

    def __call__(self, prompts: Sequence[str], seeds: Sequence[int] | None = None) -> Tensor: ...


def prompt_seed(seed: int, prompt: str) -> int:
    """A stable 63-bit seed for one prompt."""
    digest = hashlib.blake2b(f"{seed}\x00{prompt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def image_draw_seed(seed: int, image_seed: int) -> int:
    """A stable 63-bit seed for one image's LLM sample, apart from the image's own decoding stream."""
    digest = hashlib.blake2b(f"{seed}\x00llm\x00{image_seed}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def checked_draws(draws: str) -> str:
    """`draws` if it is one of DRAWS, else ConfigValueError naming model.llm.draws."""
    if draws not in DRAWS:
        raise ConfigValueError(f"model.llm.draws must be one of {list(DRAWS)}, got {draws!r}; per_image is "
                               "Tar's evaluation scripts, shared_per_prompt one sample per prompt")
    return draws


def draw_seeds(draws: str, seed: int, prompts: Sequence[str], seeds: Sequence[int] | None) -> list[int]:
    """The seed of each row's LLM sample: from the image's seed (`per_image`), or from the prompt
    (`shared_per_prompt`, and wherever the caller has no image seeds: tools that condition prompts,
    not images)."""
    if draws == "per_image" and seeds is not None:
        if len(seeds) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} image seeds")
        return [image_draw_seed(seed, int(s)) for s in seeds]
    return [prompt_seed(seed, p) for p in prompts]


def parse_codes(text: str, seq_len: int) -> list[int]:
    """`<I123><I7>...` in generated text -> exactly `seq_len` codes (truncated / zero-padded, as Tar)."""
    codes = [int(m) for m in _CODE.findall(text)][:seq_len]
    return codes + [0] * (seq_len - len(codes))


class TarLLM:
    """Qwen2 causal LM of a Tar checkpoint, sampling TA-Tok codes.

    The rows of a call decode together, `batch_size` rows per `generate` (left-padded, masked),
    and each row samples from its own seeded stream (`RowSampler`), so a row's codes do not
    depend on the rows beside it. The sampling is the effective generation config (`generation`):
    the checkpoint's `generation_config.json` with the given temperature / top_p / top_k on top,
    applied per row as `generate(do_sample=True)` applies it to that row alone."""

    # the repo files it reads (config, generation defaults, Qwen2 tokenizer and chat template) and its
    # weights in WEIGHTS order: safetensors, else .bin (transformers' order; never both)
    FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json",
             "merges.txt", "added_tokens.json", "special_tokens_map.json", "chat_template.*")
    WEIGHTS = WEIGHT_ORDER

    def __init__(self, repo_id: str = "csuhan/Tar-1.5B", local_path: str | None = None,
                 cache_dir: str | None = None, scale: int = 0, seq_len: int = 729, dtype: str = "bf16",
                 device: str | None = None, temperature: float = 1.0, top_p: float | None = None,
                 top_k: int | None = None, seed: int = 0, draws: str = "per_image",
                 system_prompt: str = "You are a helpful assistant.", batch_size: int = 16) -> None:
        self.draws = checked_draws(draws)
        if batch_size < 1:
            raise ConfigValueError(f"model.llm.batch_size must be at least 1, got {batch_size}")
        try:
            from transformers import AutoTokenizer, Qwen2ForCausalLM
        except ImportError as err:
            raise ImportError("Tar's LLM stage needs transformers: pip install transformers") from err
        folder = weights_snapshot(repo_id, local_path, cache_dir, self.FILES, self.WEIGHTS)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(folder)
            self.model = Qwen2ForCausalLM.from_pretrained(folder, torch_dtype=dtype_of(dtype)).eval()
        except OSError as err:
            raise WeightsError(f"cannot load the Tar LLM from {folder} (repo {repo_id}): {err}") from err
        if device:
            self.model.to(device)
        self.folder = folder  # the condition cache identifies the weights by its files
        self.scale, self.seq_len, self.seed, self.system_prompt = scale, seq_len, seed, system_prompt
        self.batch_size = batch_size
        given = {"temperature": temperature, "top_p": top_p, "top_k": top_k}
        self.config = effective_config(self.model.generation_config, {k: v for k, v in given.items()
                                                                       if v is not None})
        self.generation = generation_diff(self.config)
        self.generate_calls = 0
        log.info("Tar LLM %s: effective generation config %s", repo_id, self.generation)

    def to(self, device: torch.device | str) -> "TarLLM":
        self.model.to(device)
        return self

    def _input(self, prompt: str) -> list[int]:
        messages = [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": prompt}]
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(self.tokenizer(text + f"<im_start><S{self.scale}>").input_ids)

    @torch.inference_mode()
    def __call__(self, prompts: Sequence[str], seeds: Sequence[int] | None = None) -> Tensor:
        """prompts (one per image), the images' seeds -> codes [B, seq_len]; rows decode
        `batch_size` at a time, each from its own seeded stream (`draw_seeds`)."""
        draws = draw_seeds(self.draws, self.seed, prompts, seeds)
        rows: list[list[int]] = []
        for start in range(0, len(prompts), self.batch_size):
            rows += self._decode(list(prompts[start:start + self.batch_size]), draws[start:start + self.batch_size])
        return torch.tensor(rows, dtype=torch.long)

    def _decode(self, prompts: list[str], draws: list[int]) -> list[list[int]]:
        """One left-padded `generate` of these rows -> their codes."""
        device = next(self.model.parameters()).device
        inputs = [self._input(p) for p in prompts]
        width = max(len(ids) for ids in inputs)
        pad = self.config.pad_token_id
        pad = int(pad if pad is not None else self.tokenizer.pad_token_id or 0)
        ids = torch.tensor([[pad] * (width - len(x)) + x for x in inputs], device=device)
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in inputs], device=device)
        sampler = RowSampler(self.config, draws, [width - len(x) for x in inputs], device)
        from transformers import LogitsProcessorList

        self.generate_calls += 1
        out = self.model.generate(ids, attention_mask=mask, max_new_tokens=self.seq_len, pad_token_id=pad,
                                  logits_processor=LogitsProcessorList([sampler]), **GREEDY)
        texts = self.tokenizer.batch_decode(out[:, width:], skip_special_tokens=False)
        return [parse_codes(text, self.seq_len) for text in texts]


def fetched_generation(repo_id: str = "csuhan/Tar-1.5B", local_path: str | None = None,
                       cache_dir: str | None = None, temperature: float = 1.0, top_p: float | None = None,
                       top_k: int | None = None, **_: object) -> dict[str, object]:
    """The effective generation config (`generation_diff`) a TarLLM of this config node samples
    with, read from the repo's `generation_config.json` alone (fetch prints it)."""
    from transformers import GenerationConfig

    folder = snapshot(repo_id, local_path, cache_dir, ("generation_config.json",))
    try:
        base = GenerationConfig.from_pretrained(folder)
    except OSError:  # no generation_config.json: transformers' defaults
        base = GenerationConfig()
    given = {"temperature": temperature, "top_p": top_p, "top_k": top_k}
    return generation_diff(effective_config(base, {k: v for k, v in given.items() if v is not None}))


class TinyCodeLM:
    """A seeded random stand-in for the Tar LLM (tests, tiny stacks): codes drawn from a generator
    seeded as TarLLM seeds its samples (`draws`, `draw_seeds`)."""

    def __init__(self, codebook_size: int = 512, seq_len: int = 9, seed: int = 0,
                 draws: str = "per_image") -> None:
        self.codebook_size, self.seq_len, self.seed = codebook_size, seq_len, seed
        self.draws = checked_draws(draws)

    def __call__(self, prompts: Sequence[str], seeds: Sequence[int] | None = None) -> Tensor:
        gens = [torch.Generator().manual_seed(s) for s in draw_seeds(self.draws, self.seed, prompts, seeds)]
        return torch.stack([torch.randint(0, self.codebook_size, (self.seq_len,), generator=g) for g in gens])


class TarConditioner:
    """prompts (one per image) and the images' seeds -> TextCondition with TA-Tok features
    [B, seq_len, hidden] (LLM stage + code embedding). `takes_seeds`: ModelBundle.condition hands
    it the image seeds, which a `per_image` LLM stage draws from."""

    takes_seeds = True

    def __init__(self, llm: CodeGenerator, tatok: TATokCodeEmbedding) -> None:
        self.llm = llm
        self.tatok = tatok

    def to(self, device: torch.device | str) -> "TarConditioner":
        self.tatok.to(device)
        if hasattr(self.llm, "to"):
            self.llm.to(device)
        return self

    @property
    def stage(self) -> CodeGenerator:
        """The costly stage, whose codes the condition cache keeps (harness/store/conditions.py)."""
        return self.llm

    @property
    def per_image(self) -> bool:
        """Whether the LLM's codes depend on the image seed (`draws: per_image`) or only on the prompt."""
        return getattr(self.llm, "draws", "per_image") == "per_image"

    def finish(self, codes: Tensor) -> TextCondition:
        """The LLM's codes [B, seq_len] -> the condition (TA-Tok code embedding)."""
        feats = self.tatok(codes)
        null = torch.zeros(codes.shape[0], dtype=torch.bool, device=feats.device)
        return TextCondition(null=null, features=feats)

    def __call__(self, prompts: Sequence[str], seeds: Sequence[int] | None = None) -> TextCondition:
        return self.finish(self.llm(prompts, seeds))
