"""A wide forward's distributions computed a chunk of positions at a time, at the positions the
decoder reads (harness/models/chunked_logits.py), equal the whole logits' gathered and finished."""
from __future__ import annotations

from functools import partial

import pytest
import torch

from harness.api import SamplingParams
from harness.models import chunked_logits
from harness.models.chunked_logits import selected_outputs
from harness.models.guidance import Guided
from harness.run import _build
from harness.runtime.sampling import probs
from tests.conftest import compose_cfg

PROMPTS = ["a red circle", "two blue squares"]


def _target(dtype: str, cfg_scale: float):  # noqa: ANN202
    """llamagen_tiny's target after a prefill, guided unless the scale is 1."""
    cfg = compose_cfg(["model=llamagen_tiny", "decoder=[raster]", f"model.dtype={dtype}"])
    bundle = _build(cfg.model, drop=("name", "sampling"))
    target = bundle.target if cfg_scale == 1.0 else Guided(bundle.target, cfg_scale)
    target.setup_cache(len(PROMPTS))
    target.prefill(bundle.condition(PROMPTS))
    return target


@pytest.mark.parametrize(("dtype", "cfg_scale"), [("fp32", 4.0), ("bf16", 4.0), ("fp32", 1.0)])
def test_selected_chunked_distributions_equal_the_whole_logits_gathered(dtype: str, cfg_scale: float,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Inputs 0..W-1 over a prefilled cache, p read at J = W + 1 indices (the last repeated, as
    MuLo-SD's verification reads): chunks of 3 positions give the values of the whole forward,
    bit for bit, with top-k filtering and softmax as the finish."""
    target = _target(dtype, cfg_scale)
    width = 10
    tokens = torch.randint(0, target.vocab_size, (len(PROMPTS), width), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(width)
    select = torch.stack([torch.arange(width + 1).clamp(max=width - 1),
                          (torch.arange(width + 1) + 2).clamp(max=width - 1)])  # [B, J], per-row offsets
    finish = partial(probs, params=SamplingParams(temperature=1.0, top_k=5, top_p=1.0))
    whole = target.forward(tokens, positions)
    expected = finish(whole.gather(1, select[..., None].expand(-1, -1, whole.shape[-1])))
    monkeypatch.setattr(chunked_logits, "LOGITS_CHUNK", 3)
    chunked = selected_outputs(target, tokens, positions, select, finish)
    assert chunked.shape == expected.shape == (len(PROMPTS), width + 1, target.vocab_size)
    assert torch.equal(chunked, expected)
    assert torch.equal(target.forward(tokens, positions), whole)  # a plain forward is unchanged


def test_models_that_do_not_select_get_the_same_values_the_plain_way() -> None:
    """`selected_outputs` falls back to gather + finish on a model without `selects_outputs`, and a
    guided model whose inner model cannot select refuses select / finish naming the fallback."""

    class Plain:  # forward only, as the Janus-Pro and Emu3 models' contract
        vocab_size, grid = 7, (2, 2)

        def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            return torch.arange(tokens.numel() * 7, dtype=torch.float32).reshape(*tokens.shape, 7).sin()

    model, tokens = Plain(), torch.zeros(2, 4, dtype=torch.long)
    select = torch.tensor([[0, 3, 3], [1, 2, 3]])
    got = selected_outputs(model, tokens, torch.arange(4), select, lambda x: x.softmax(-1))
    logits = model.forward(tokens, torch.arange(4))
    assert torch.equal(got[1, 0], logits[1, 1].softmax(-1)) and torch.equal(got[0, 2], logits[0, 3].softmax(-1))
    with pytest.raises(TypeError, match="selected_outputs"):
        Guided(model, 2.0).forward(tokens, torch.arange(4), select=select)  # type: ignore[arg-type]
