"""ReplayModel (harness/models/replay.py): one-hot predictions of a reference grid, its checks, and
as MuLo-SD's drafter (the oracle of benchmarks/mulo.py --diagnose) it drafts the reference."""
from __future__ import annotations

import pytest
import torch

from baselines.methods.local import LocalScope
from baselines.methods.lowres import LowResDraft
from baselines.methods.pooled import PooledThresholdRule
from baselines.methods.resampling import IslandResampler
from baselines.framework.speculative import SpeculativeDecoder
from baselines.methods.upsamplers import NearestUpsampler
from harness.api import ModelBundle, SamplingParams
from harness.models.random.bundle import build
from harness.models.replay import ReplayModel
from harness.run import guided
from tests.single_thread import single_thread  # noqa: F401  (autouse)

SAMPLED = SamplingParams(temperature=1.0, top_k=20, top_p=0.9, cfg_scale=2.0)


@pytest.fixture(scope="module")
def bundle() -> ModelBundle:
    return build(grid=8, vocab=32, dim=32)  # target 8 x 8, drafter 4 x 4


def test_predictions_are_one_hot_on_the_next_reference_token(bundle: ModelBundle) -> None:
    reference = torch.randint(0, 32, (2, 16), generator=torch.Generator().manual_seed(0))
    replay = ReplayModel(bundle.drafter, reference)
    replay.setup_cache(2)
    first = replay.prefill(bundle.condition(["a", "b"]))
    assert torch.equal(first.argmax(-1), reference[:, 0])
    assert torch.equal(torch.softmax(first, -1).max(-1).values, torch.ones(2))
    positions = torch.tensor([0, 5, 14, 15])  # 15 is the last: it repeats the last token
    logits = replay.forward(torch.zeros(2, 4, dtype=torch.long), positions)
    assert torch.equal(logits.argmax(-1), reference[:, [1, 6, 15, 15]])
    per_row = torch.tensor([[3, 4], [7, 0]])
    assert torch.equal(replay.forward(torch.zeros(2, 2, dtype=torch.long), per_row).argmax(-1),
                       torch.stack([reference[0, [4, 5]], reference[1, [8, 1]]]))


def test_keeps_the_wrapped_models_grid_and_tokenizer(bundle: ModelBundle) -> None:
    replay = ReplayModel(bundle.drafter)
    assert replay.grid == tuple(bundle.drafter.grid) and replay.vocab_size == bundle.drafter.vocab_size
    assert torch.equal(replay.codebook, bundle.drafter.codebook)
    tokens = torch.arange(16)[None] % 32
    assert torch.equal(replay.decode(tokens), bundle.drafter.decode(tokens))


def test_bad_references_and_batches_are_refused(bundle: ModelBundle) -> None:
    replay = ReplayModel(bundle.drafter)
    with pytest.raises(ValueError, match=r"\[batch, 16\]"):
        replay.replay(torch.zeros(2, 15, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[0, 32\)"):
        replay.replay(torch.full((1, 16), 32))
    with pytest.raises(ValueError, match="replay\\(tokens\\) before decoding"):
        replay.setup_cache(1)
    replay.replay(torch.zeros(2, 16, dtype=torch.long))
    with pytest.raises(ValueError, match="a batch of 3 needs a reference of 3 rows"):
        replay.setup_cache(3)


@pytest.mark.parametrize("schedule", ["serial", "zipar"])
def test_as_mulo_drafter_at_tau_zero_the_output_is_the_upsampled_reference(bundle: ModelBundle,
                                                                         schedule: str) -> None:
    """Sampled, with guidance on the target: every draft accepted, the image is U_r(reference)
    (nearest: each low-res token replicated into a 2 x 2 block), except position 0 (the target's
    prefill samples it)."""
    models = guided(bundle, SAMPLED)
    low = torch.randint(0, 32, (3, 16), generator=torch.Generator().manual_seed(1))
    oracle = ModelBundle(name="oracle", target=models.target, conditioner=models.conditioner,
                         drafter=ReplayModel(bundle.drafter, low))  # type: ignore[arg-type]
    draft = LowResDraft(NearestUpsampler(), rows=None, schedule=schedule, window=2)
    decoder = SpeculativeDecoder(SAMPLED, draft, PooledThresholdRule(k=1, tau=0.0), LocalScope(3),
                                 IslandResampler("parallel", window=2))
    out = decoder.generate(oracle, oracle.condition(["a", "b", "c"]), [4, 5, 6]).tokens
    expected = low.view(3, 4, 4).repeat_interleave(2, 1).repeat_interleave(2, 2).flatten(1)
    assert torch.equal(out[:, 1:], expected[:, 1:])
