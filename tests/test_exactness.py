"""The exactness check with length (harness/exactness): the Markov target's closed-form law is its
law (teacher forcing, and images drawn from it pass); every lossless decoder of the field passes on
3000 images of 36 positions, at the harness's schedule and at the released single-token head and
tail; every negative control (baselines/methods/controls.py) and GSD at its lossy defaults fail
with margin; the schedule options are validated and do what they say; the command prints the table
and refuses a name it does not know."""
from __future__ import annotations

import pytest
import torch

from harness.api import ConfigValueError, SamplingParams
from harness.checks import build_decoder
from harness.exactness.__main__ import main
from harness.exactness.check import Target, decoder, measure
from harness.exactness.stats import judge
from harness.runtime.sampling import probs
from tests.conftest import compose_cfg
from tests.single_thread import single_thread  # noqa: F401  (autouse)

IMAGES = 3000
RELEASED = ("draft.head=3", "draft.tail=10")  # the released samplers' l = 3, r = N - 10
LOSSLESS = [
    ("raster", ()), ("sjd", ()), ("sjd", RELEASED), ("scd", ()), ("scd", ("draft.coupling=maximal",)),
    ("scd", RELEASED), ("gsd", ("accept.rank_window=0",)), ("sd", ()),
    # ~15 s each on a shared CPU: the default run checks sjd_pac on the tiny model (test_field_lossless.py)
    pytest.param("sjd_pac", (), marks=pytest.mark.slow),
    pytest.param("sjd_pac", RELEASED, marks=pytest.mark.slow),
]
# (control, the least pair-TVD z it must reach: about half of what docs/field.md's table measures)
CONTROLS = [("scd_one_noise_row", 40.0), ("scd_tail_noise", 9.0), ("scd_released_maximal", 30.0),
            ("sjd_wrong_residual", 20.0), ("gsd", 9.0)]


@pytest.fixture(scope="module")
def target() -> Target:
    return Target.make(IMAGES)


def test_exactness_law_is_the_models_law(target: Target) -> None:
    """The closed-form law against the model itself: teacher-forced conditionals are the law's
    transitions, pairs sum to the marginals, and images drawn from the law pass the check while the
    same images with two positions swapped fail."""
    model, law = target.bundle.target, target.law
    n = target.n_tokens
    params = SamplingParams()
    seqs = torch.randint(0, model.vocab_size, (8, n))
    p = probs(model.forward(seqs[:, :-1], torch.arange(n - 1)), params).double()  # [8, N-1, V]
    expected = law.transitions[torch.arange(n - 1)[None], seqs[:, :-1]]
    assert torch.allclose(p, expected, atol=1e-6)
    assert torch.allclose(law.pairs.sum(-1), law.marginals[:-1]) and torch.allclose(law.pairs.sum(1), law.marginals[1:])
    drawn = law.sample(IMAGES, torch.Generator().manual_seed(7))
    assert judge(drawn, law, target.null, float(n)).passed
    swapped = drawn.clone()
    swapped[:, [10, 20]] = swapped[:, [20, 10]]
    assert not judge(swapped, law, target.null, float(n)).passed


def _label(case) -> str:
    name, overrides = case.values if hasattr(case, "values") else case
    return " ".join([name, *overrides])


@pytest.mark.parametrize("name, overrides", LOSSLESS, ids=[_label(c) for c in LOSSLESS])
def test_exactness_lossless_decoders_pass(target: Target, name: str, overrides: tuple[str, ...]) -> None:
    """Every lossless decoder passes (per-position and pair TVD within 4 null sd, Bonferroni pair
    chi-square p >= 1e-3), in fewer target forwards than raster's 36 unless it is raster."""
    v = measure(name, target, overrides)
    assert v.passed, v
    assert (v.steps == target.n_tokens) if name == "raster" else (v.steps < target.n_tokens - 5)


@pytest.mark.parametrize("name, least_z", CONTROLS)
def test_exactness_controls_fail_with_margin(target: Target, name: str, least_z: float) -> None:
    """Every negative control (and GSD at its lossy defaults) fails, its pair TVD far beyond the
    null (z >= least_z) and its Bonferroni pair chi-square p below 1e-12."""
    v = measure(name, target)
    assert not v.passed and v.pair_z > least_z and v.chi2_p < 1e-12, v


@pytest.mark.slow
def test_exactness_sjd_pac_longest_path_fails_at_10000_images() -> None:
    """SJD-PAC's released longest-path selection is biased only where several siblings pass
    (the first positions, drafted from the uniform initial guesses): 3000 images do not see it,
    10,000 do (pairs 0-1 and 1-2), while `sjd_pac` passes on the same 10,000 seeds."""
    big = Target.make(10_000)
    assert measure("sjd_pac", big).passed
    v = measure("sjd_pac_longest_path", big)
    assert not v.passed and 0 in v.failing_pairs, v


@pytest.mark.parametrize("name", ["sjd", "scd", "sjd_pac"])
def test_exactness_head_and_tail_decode_one_token_per_forward(target: Target, name: str) -> None:
    """A head or a tail covering the image is raster decoding (N target forwards, no draft
    accepted); the released head 3 / tail 10 costs more forwards than none, at least 13."""
    models, n = target.bundle, target.n_tokens
    cond = models.condition(["x"] * 16)

    def forwards(*overrides: str) -> list[int]:
        gen = decoder(name, overrides, n).generate(models, cond, list(range(16)))
        return [s.target_forwards for s in gen.stats]

    assert forwards(f"draft.head={n}") == [n] * 16
    assert forwards(f"draft.tail={n}") == [n] * 16
    released, harness = forwards(*RELEASED), forwards()
    assert min(released) >= 13 and sum(released) > sum(harness)


@pytest.mark.parametrize("name", ["sjd", "scd", "sjd_pac"])
@pytest.mark.parametrize("key", ["head", "tail"])
def test_exactness_schedule_refuses_negative_lengths(name: str, key: str) -> None:
    cfg = compose_cfg([f"decoder=[{name}]", "model=random", f"decoder.{name}.draft.{key}=-1"])
    with pytest.raises(ConfigValueError, match=rf"decoder\.{name}\.draft\.{key}"):
        build_decoder(name, cfg.decoder[name])


def test_exactness_command_prints_the_table_and_refuses_unknown_names(capsys) -> None:
    assert main(["sjd_wrong_residual", "--images", "400", "--replicates", "40"]) == 0
    out = capsys.readouterr().out
    assert "| sjd_wrong_residual |" in out and "FAIL" in out
    assert main(["no_such_decoder", "--images", "400"]) == 2
    assert main(["sjd", "--images", "10"]) == 2
