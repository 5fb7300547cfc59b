"""The pieces written once and used everywhere: the attention-mask builder (harness/models/masks.py)
against the masks the GPT and the decoders used to build by hand, the inverse-CDF sampler
(harness/runtime/sampling.py), attribute forwarding (harness/models/wrapper.py), the draft-source and
rejection-scope base classes with their defaults, and the stateless local scope."""
from __future__ import annotations

import pytest
import torch

from baselines.framework.acceptance import ExactRule
from baselines.framework.drafts import DraftRun, DraftSource, JacobiDraft, ModelDraft
from baselines.methods.local import LocalScope
from baselines.framework.scope import RasterScope, RejectionScope
from baselines.framework.speculative import SpeculativeDecoder
from harness.api import SamplingParams
from harness.models.guidance import Guided
from harness.models.masks import attention_mask, hide
from harness.models.random.bundle import build
from harness.models.replay import ReplayModel
from harness.models.wrapper import forwarded
from harness.runtime.randomness import ImageStreams
from harness.runtime.sampling import inverse_cdf, sample_from
from tests.single_thread import single_thread  # noqa: F401  (autouse)

S = 12  # cache slots


def _bools(*shape: int, seed: int) -> torch.Tensor:
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) > 0.5


def _queries(b: int, t: int, seed: int) -> torch.Tensor:
    return torch.randint(0, S, (b, t), generator=torch.Generator().manual_seed(seed))


def test_slot_causal_mask_is_key_at_or_before_query() -> None:
    query = _queries(3, 5, 0)
    expected = query[:, :, None] >= torch.arange(S)
    assert torch.equal(attention_mask(query, S), expected)


@pytest.mark.parametrize("seed", range(4))
def test_hidden_keys_with_and_without_the_own_slot(seed: int) -> None:
    """Per-row hidden keys [B, S]: the resampler's mask (a query keeps its own slot) and the
    lowres drafter's (it does not), as both were written by hand."""
    query, hidden = _queries(3, 5, seed), _bools(3, S, seed=seed + 10)
    key, q = torch.arange(S), query[:, :, None]
    resampler = (key <= q) & ~(hidden[:, None, :] & (key != q))
    drafter = ~hidden[:, None, :] & (key[None, None, :] <= q)
    assert torch.equal(attention_mask(query, S, hidden), resampler)
    assert torch.equal(attention_mask(query, S, hidden, own=False), drafter)


def test_shared_hidden_keys_for_unbatched_queries() -> None:
    """ZipAR's mask: one written set [S] and query slots [T]."""
    written, query = _bools(S, seed=3), torch.tensor([2, 5, 11])
    causal = torch.arange(S)[None] <= query[:, None]
    assert torch.equal(attention_mask(query, S, ~written, own=False), causal & written[None])


def test_per_query_hidden_keys_and_the_caption_padding_mask() -> None:
    """Per-query hidden [B, T, S] (training gaps) and `hide` on a given mask (LlamaGen's padded
    caption slots: seen only by themselves), as the GPT built them by hand."""
    query = torch.arange(S).expand(2, -1)
    gaps = _bools(2, S, S, seed=4)
    assert torch.equal(attention_mask(query, S, gaps, own=False), attention_mask(query, S) & ~gaps)
    given, keep = _bools(2, S, S, seed=5), _bools(2, 4, seed=6)
    own = query[:, :, None] == torch.arange(4)
    by_hand = torch.cat([given[:, :, :4] & (keep[:, None, :] | own), given[:, :, 4:]], -1)
    padded = torch.cat([~keep, torch.zeros(2, S - 4, dtype=torch.bool)], 1)
    assert torch.equal(hide(given, query, padded), by_hand)


def test_inverse_cdf_picks_the_first_token_whose_mass_exceeds_u() -> None:
    g = torch.Generator().manual_seed(0)
    p = torch.rand(4, 6, 9, generator=g)
    p[0, 0, 3:] = 0.0  # a row with trailing zeros
    p = p / p.sum(-1, keepdim=True)
    u = torch.rand(4, 6, generator=g)
    u[0, 0] = 1.0 - 1e-7  # the clamp keeps it on the last token with mass
    cdf = p.cumsum(-1)
    expected = (cdf <= (u * cdf[..., -1])[..., None]).sum(-1).clamp_max(8)
    assert torch.equal(inverse_cdf(p, u), expected)
    assert int(inverse_cdf(p, u)[0, 0]) <= 2


def test_sample_from_is_inverse_cdf_with_the_images_uniforms() -> None:
    p = torch.softmax(torch.randn(3, 5, 7, generator=torch.Generator().manual_seed(1)), -1)
    u = ImageStreams([4, 5, 6]).draw((5,))
    assert torch.equal(sample_from(p, ImageStreams([4, 5, 6])), inverse_cdf(p, u))
    first = sample_from(p[:, 0], ImageStreams([4, 5, 6]))
    assert torch.equal(first, inverse_cdf(p[:, :1], u[:, :1])[:, 0])


def test_wrappers_forward_the_models_attributes() -> None:
    bundle = build(grid=4, vocab=16, dim=32)
    model = bundle.target
    assert model.cache_len == model.gpt.slots and model.prefix_len == model.gpt.cfg.prefix_len
    assert model.device == model.gpt.output.weight.device
    assert torch.equal(model.codebook, model.tokenizer.codebook)
    for wrapper in (Guided(model, 2.0), ReplayModel(model)):
        assert wrapper.grid == tuple(model.grid) and wrapper.vocab_size == model.vocab_size
        assert wrapper.cache_len == model.cache_len and wrapper.device == model.device
        assert torch.equal(wrapper.codebook, model.codebook)
        tokens = torch.zeros(1, 16, dtype=torch.long)
        assert torch.equal(wrapper.decode(tokens), model.decode(tokens))
    with pytest.raises(AttributeError, match="cache_len is read from gpt.slots"):
        model.cache_len = 3


def test_forwarded_reads_a_dotted_path() -> None:
    class Box:
        size = forwarded("inner.shape.numel")

        def __init__(self) -> None:
            self.inner = torch.zeros(2, 3)

    assert Box().size() == 6 and isinstance(Box.size, forwarded)


def test_sources_and_scopes_declare_the_loops_defaults() -> None:
    bundle = build(grid=4, vocab=16, dim=32)
    for source in (JacobiDraft(window=3), ModelDraft(gamma=2)):
        assert isinstance(source, DraftSource) and source.bind(bundle) is source
        assert source.whole_image is False
    raster = RasterScope()
    assert raster.bind(7) is raster
    assert (raster.rounds, raster.refeed, raster.needs_resampler) == (1, 1, False)
    local = LocalScope(2, rounds=3)
    bound = local.bind(16)
    assert isinstance(bound, RejectionScope) and bound.refeed == 16 and bound.rounds == 3
    with pytest.raises(TypeError):
        DraftSource()  # type: ignore[abstract]
    with pytest.raises(TypeError):
        RejectionScope()  # type: ignore[abstract]
    with pytest.raises(TypeError):
        DraftRun()  # type: ignore[abstract]


def test_local_scope_is_stateless_and_threads_its_round_counts() -> None:
    """rounds = 2: a row that rejects something re-verifies its block once (advance t0 + 1,
    verified 1); given verified 1 it commits the block (verified 0). The scope object never
    changes, so one resolve with the same inputs gives the same resolution."""
    scope = LocalScope(1, rounds=2).bind(8)
    before = dict(vars(scope))
    accept = torch.ones(2, 8, dtype=torch.bool)
    accept[0, 3] = False  # row 0 rejects offset 3; row 1 accepts everything
    remaining = torch.tensor([40, 40])
    first = scope.resolve(accept, remaining, (8, 8))
    assert first.advance.tolist() == [4, 8] and first.verified.tolist() == [1, 0]
    again = scope.resolve(accept, remaining, (8, 8))
    assert torch.equal(again.advance, first.advance) and torch.equal(again.verified, first.verified)
    second = scope.resolve(accept, remaining, (8, 8), first.verified)
    assert second.advance.tolist() == [8, 8] and second.verified.tolist() == [0, 0]
    assert vars(scope) == before
    assert LocalScope(1).bind(8).resolve(accept, remaining, (8, 8)).verified is None  # rounds 1: no count


def test_speculative_loop_decodes_the_same_with_a_reused_decoder() -> None:
    """The decoder holds no per-call state: two calls with the same seeds give the same images."""
    bundle = build(grid=4, vocab=16, dim=32)
    params = SamplingParams(temperature=1.0, cfg_scale=1.0)
    decoder = SpeculativeDecoder(params, JacobiDraft(window=3), ExactRule())
    cond = bundle.condition(["a red circle", "two blue squares"])
    a, b = decoder.generate(bundle, cond, [1, 2]), decoder.generate(bundle, cond, [1, 2])
    assert torch.equal(a.tokens, b.tokens)
