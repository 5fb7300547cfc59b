"""The lossless field decoders `sjd_pac` (baselines/methods/proactive.py) and `scd`
(baselines/methods/coupled_jacobi.py): greedy decoding equals raster; the distribution of whole tiny
images (2 x 2 over 3 codes, enumerated by teacher forcing) equals the target's by Monte Carlo (TVD
under the sampling-noise bound and a chi-square p-value) while a deliberately biased variant of each
fails the same test; the released SCD maximal coupling's bookkeeping measured as biased; batch 1 =
batch 4; bad options refused by their full key."""
from __future__ import annotations

import pytest
import torch
from torch import Tensor

from baselines.framework.acceptance import ExactRule, _normalise
from baselines.framework.drafts import Outcome
from baselines.framework.speculative import SpeculativeDecoder
from baselines.methods.coupled_jacobi import CoupledJacobiDraft, _CoupledRun, keyed_gumbel
from baselines.methods.proactive import ProactiveDecoder, SiblingsWithoutReplacement
from baselines.methods.raster import RasterDecoder
from harness.api import ConfigValueError, ModelBundle, SamplingParams
from harness.checks import build_decoder
from harness.datasets.prompts import shapes
from baselines.methods.controls import LongestPathDecoder, ReleasedMaximalDraft
from harness.models.random.bundle import build
from harness.run import _build, guided
from harness.store.samples import plan
from harness.runtime.randomness import ImageStreams
from tests.conftest import compose_cfg
from tests.single_thread import single_thread  # noqa: F401  (autouse)
from tests.test_speculative import _enumerated_target, _noise_bound, _tiny_bundle

PROMPTS = ["a red circle", "a blue square", "two green triangles above a circle", "a yellow star"]
SAMPLED = ["sampling.temperature=1.0", "sampling.top_k=20", "sampling.top_p=0.9", "sampling.cfg_scale=2.0"]
DECODERS = {"sjd_pac": [], "scd": [], "scd_maximal": ["decoder.scd.draft.coupling=maximal"],
            "scd_none": ["decoder.scd.draft.coupling=none"]}


@pytest.fixture(scope="module")
def bundle() -> ModelBundle:
    return build(grid=4, vocab=32, dim=32)


def _decoder(label: str, extra: list[str] | None = None, window: int = 5):
    """The decoder of conf/decoder/<name>.yaml with a short window (more steps on a 4 x 4 grid)."""
    name = label.split("_")[0] if label.startswith("scd") else label
    overrides = [f"decoder=[{name}]", "model=random", *SAMPLED, *DECODERS[label], *(extra or [])]
    overrides.append(f"decoder.{name}.draft.window={window}")
    return _build(compose_cfg(overrides).decoder[name])


@pytest.mark.parametrize("label", list(DECODERS))
def test_sjd_pac_and_scd_exact_greedy_equals_raster(bundle: ModelBundle, label: str) -> None:
    """sjd_pac / scd (every coupling) at temperature 0 give raster's tokens, in fewer forwards."""
    decoder = _decoder(label, ["sampling.temperature=0.0"])
    models = guided(bundle, decoder.sampling)
    cond = models.condition(PROMPTS)
    raster = RasterDecoder(decoder.sampling).generate(models, cond, [1, 2, 3, 4])
    out = decoder.generate(models, cond, [5, 6, 7, 8])
    assert torch.equal(out.tokens, raster.tokens)
    assert min(s.target_forwards for s in out.stats) < 16, "some drafts were accepted"


# ----------------------------------------------------------------------------- Monte Carlo
class _StickyRun(_CoupledRun):
    """A biased coupling (the negative control): the old guess is always kept, yet the next
    verification is told it was drawn from p."""

    def _samples(self, outcome: Outcome) -> Tensor:
        length = self.source.length
        return torch.cat([self.tokens, outcome.samples[:, length:]], 1)


class _StickyDraft(CoupledJacobiDraft):
    def start(self, ctx, canvas):
        return _StickyRun(self, ctx, canvas)


def _counts(decoder, models: ModelBundle, prompt: str, samples: int) -> dict[tuple, int]:
    tokens = decoder.generate(models, models.condition([prompt] * samples), list(range(samples))).tokens
    counts: dict[tuple, int] = {}
    for row in map(tuple, tokens.tolist()):
        counts[row] = counts.get(row, 0) + 1
    return counts


def _tvd_and_p(counts: dict[tuple, int], exact: dict[tuple, float], samples: int) -> tuple[float, float]:
    """TVD to the exact distribution, and the chi-square p-value of the counts (cells expecting
    fewer than 5 samples pooled into one)."""
    tvd = 0.5 * sum(abs(counts.get(s, 0) / samples - pr) for s, pr in exact.items())
    obs, exp, rest_o, rest_e = [], [], 0.0, 0.0
    for s, pr in exact.items():
        if pr * samples >= 5:
            obs.append(counts.get(s, 0))
            exp.append(pr * samples)
        else:
            rest_o, rest_e = rest_o + counts.get(s, 0), rest_e + pr * samples
    if rest_e > 0:
        obs.append(rest_o)
        exp.append(rest_e)
    o, e = torch.tensor(obs, dtype=torch.float64), torch.tensor(exp, dtype=torch.float64)
    stat = float(((o - e) ** 2 / e).sum())
    dof = len(obs) - 1
    p_value = float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                            torch.tensor(stat / 2.0, dtype=torch.float64)))
    return tvd, p_value


def _tiny_decoder(params: SamplingParams, draft: CoupledJacobiDraft) -> SpeculativeDecoder:
    return SpeculativeDecoder(params, draft, ExactRule())


@pytest.mark.parametrize("coupling", ["gumbel", "maximal"])
def test_scd_exact_distribution_matches_the_target(coupling: str) -> None:
    """Whole 2 x 2 images over 3 codes (81 outcomes), 3000 samples: scd's image distribution is
    the enumerated target's (TVD under mean + 6 sd of pure sampling noise, chi-square p > 1e-3),
    and the sticky coupling (old guesses kept but passed off as drawn from p) fails the same test."""
    params = SamplingParams(temperature=1.0, top_k=2, cfg_scale=1.5)
    models = guided(_tiny_bundle(), params)
    prompt = "a red circle"
    exact = _enumerated_target(models, prompt, params)
    samples = 3000
    bound = _noise_bound(exact, samples)
    counts = _counts(_tiny_decoder(params, CoupledJacobiDraft(window=3, coupling=coupling)), models, prompt, samples)
    tvd, p_value = _tvd_and_p(counts, exact, samples)
    assert tvd < bound and p_value > 1e-3, f"scd {coupling}: TVD {tvd:.4f} (bound {bound:.4f}), p {p_value:.2g}"
    biased = _counts(_tiny_decoder(params, _StickyDraft(window=3, coupling=coupling)), models, prompt, samples)
    tvd_b, p_b = _tvd_and_p(biased, exact, samples)
    assert tvd_b > 1.5 * bound and p_b < 1e-6, f"the test cannot see a biased coupling (TVD {tvd_b:.4f}, p {p_b:.2g})"


class _SiblingsKeepP(SiblingsWithoutReplacement):
    """A biased tree rule (the negative control): later siblings are tested against the node's p
    instead of the residual the earlier rejections leave (the drafts' q is updated correctly)."""

    def siblings(self, dist: Tensor, xs: Tensor, valid: Tensor, u: Tensor, ctx) -> tuple[Tensor, Tensor]:
        _, after = super().siblings(dist, xs, valid, u, ctx)  # what is left when all fail: as exact
        p, q = dist, self.q
        taken = torch.full(xs.shape[:-1], -1, dtype=torch.long, device=xs.device)
        for j in range(xs.shape[-1]):  # the exact walk with p never replaced by the residual
            x = xs[..., j:j + 1]
            live = valid[..., j] & (taken < 0)
            take = live & (u[..., j] * q.gather(-1, x)[..., 0] < p.gather(-1, x)[..., 0])
            q = torch.where((live & ~take)[..., None], _normalise(q.scatter(-1, x, 0.0), q), q)
            taken = torch.where(take, j, taken)
        return taken, after


@pytest.mark.parametrize("coupling", ["maximal", "none"])
def test_sjd_pac_exact_distribution_matches_the_target(coupling: str) -> None:
    """As the scd test, for sjd_pac (a K = 2, D = 3 tree over a window of 2, with and without the
    continuation) on the tiny model; its negative control tests later siblings against p instead of
    the residual (`_SiblingsKeepP`)."""
    params = SamplingParams(temperature=1.0, top_k=2, cfg_scale=1.5)
    models = guided(_tiny_bundle(), params)
    prompt = "a red circle"
    exact = _enumerated_target(models, prompt, params)
    samples = 3000
    bound = _noise_bound(exact, samples)

    def decoder() -> ProactiveDecoder:
        return ProactiveDecoder(params, CoupledJacobiDraft(window=2, coupling=coupling), ExactRule(),
                                tree_width=2, tree_depth=3)

    fair = decoder()
    counts = _counts(fair, models, prompt, samples)
    tvd, p_value = _tvd_and_p(counts, exact, samples)
    assert tvd < bound and p_value > 1e-3, f"sjd_pac: TVD {tvd:.4f} (bound {bound:.4f}), p {p_value:.2g}"
    biased = decoder()
    biased.rule = _SiblingsKeepP()
    tvd_b, p_b = _tvd_and_p(_counts(biased, models, prompt, samples), exact, samples)
    assert tvd_b > bound and p_b < 1e-6, f"the test cannot see a biased tree rule (TVD {tvd_b:.4f}, p {p_b:.2g})"


def test_scd_exact_released_maximal_bookkeeping_is_biased() -> None:
    """A counterexample, measured: with the old q kept for a kept guess (the released code's
    bookkeeping, the coupling applied once: baselines/methods/controls.ReleasedMaximalDraft; `scd`
    books q = p, the law the kept guess actually has) the images drift from the target. On the tiny
    model with seeds 0..2999 the chi-square test rejects it (p = 1.9e-5; TVD 0.033 stays under the
    TVD noise bound 0.045, so only the chi-square test sees it), while `scd`'s own maximal coupling
    passes the same test (p = 0.81, test_scd_exact_distribution_matches_the_target). The Markov
    target rejects it at every pair (tests/test_exactness.py)."""
    params = SamplingParams(temperature=1.0, top_k=2, cfg_scale=1.5)
    models = guided(_tiny_bundle(), params)
    prompt = "a red circle"
    exact = _enumerated_target(models, prompt, params)
    samples = 3000
    draft = ReleasedMaximalDraft(window=3, init="random")
    tvd, p_value = _tvd_and_p(_counts(_tiny_decoder(params, draft), models, prompt, samples), exact, samples)
    assert p_value < 1e-4, f"the released bookkeeping passed: TVD {tvd:.4f}, p {p_value:.2g}"


def test_sjd_pac_exact_released_longest_path_is_biased() -> None:
    """A counterexample, measured: SJD-PAC's released selection of the longest passed root-to-leaf
    path (`LongestPathDecoder`, on this decoder's tree, candidates and uniforms) is not lossless
    once the tree has two levels: which sibling is kept at level 1 then depends on the tests of
    level 2. On the tiny model (K = 2, D = 3, window 3, seeds 0..2999) the chi-square test rejects it
    (p ~ 2e-7; TVD ~0.039 stays under the TVD noise bound), while `sjd_pac`'s sequential rule passes
    the same test (p ~ 0.7). With a single tree level (D = 2) the two rules coincide."""
    params = SamplingParams(temperature=1.0, top_k=2, cfg_scale=1.5)
    models = guided(_tiny_bundle(), params)
    prompt = "a red circle"
    exact = _enumerated_target(models, prompt, params)
    samples = 3000

    def p_value(cls: type[ProactiveDecoder]) -> float:
        decoder = cls(params, CoupledJacobiDraft(window=3, coupling="maximal"), ExactRule(), tree_width=2,
                      tree_depth=3)
        return _tvd_and_p(_counts(decoder, models, prompt, samples), exact, samples)[1]

    assert p_value(ProactiveDecoder) > 1e-3
    assert p_value(LongestPathDecoder) < 1e-4


# ----------------------------------------------------------------------------- batches, options
@pytest.mark.parametrize("label", ["sjd_pac", "scd", "scd_maximal"])
def test_sjd_pac_and_scd_exact_batch_size_does_not_change_images(bundle: ModelBundle, label: str) -> None:
    decoder = _decoder(label, window=4)
    models = guided(bundle, decoder.sampling)
    specs = plan(shapes(4), images_per_prompt=2, global_seed=5)
    results = {}
    for size in (1, 4):
        rows = {}
        for i in range(0, len(specs), size):
            chunk = specs[i: i + size]
            gen = decoder.generate(models, models.condition([s.prompt.text for s in chunk]), [s.seed for s in chunk])
            for spec, row, stats in zip(chunk, gen.tokens, gen.stats):
                rows[spec.sample_id] = (row, stats.as_row())
        results[size] = rows
    for sid, (row, stats) in results[1].items():
        assert torch.equal(row, results[4][sid][0]), sid
        assert stats == results[4][sid][1], sid
    assert len({stats["target_forwards"] for _, stats in results[1].values()}) > 1


def test_scd_exact_gumbel_noise_is_per_image_and_position() -> None:
    """The hashed noise: fixed per (image seed, position, token), the same whatever the batch, and
    Gumbel-distributed (mean ~ 0.5772, the Euler-Mascheroni constant)."""
    pair = ImageStreams([7, 9]).keys
    alone = ImageStreams([9]).keys
    positions = torch.tensor([[3, 4, 5]])
    g = keyed_gumbel(pair, positions.expand(2, -1), 50)
    assert torch.equal(g[1], keyed_gumbel(alone, positions, 50)[0])
    assert not torch.equal(g[0], g[1]) and not torch.equal(g[0, 0], g[0, 1])
    big = keyed_gumbel(pair, torch.arange(200)[None].expand(2, -1), 500)
    assert abs(float(big.mean()) - 0.5772) < 0.01


@pytest.mark.parametrize("name, override, key", [
    ("scd", "draft.coupling=antithetic", "draft.coupling"),
    ("scd", "draft.window=0", "draft.window"),
    ("sjd_pac", "draft.coupling=sticky", "draft.coupling"),
    ("sjd_pac", "draft.window=-3", "draft.window"),
    ("sjd_pac", "tree_width=0", "tree_width"),
    ("sjd_pac", "tree_depth=0", "tree_depth"),
    ("sjd_pac", "tree_depth=66", "tree_depth"),
])
def test_sjd_pac_and_scd_exact_refuses_bad_options(name: str, override: str, key: str) -> None:
    """A refused option is named by its full key (harness/checks.build_decoder)."""
    cfg = compose_cfg([f"decoder=[{name}]", "model=random", f"decoder.{name}.{override}"])
    with pytest.raises(ConfigValueError, match=f"decoder.{name}.{key}".replace(".", r"\.")):
        build_decoder(name, cfg.decoder[name])

