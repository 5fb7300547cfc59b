"""One exactness check: a decoder of conf/decoder/ (or a negative control, baselines/methods/controls.py) decodes
`images` images of the Markov target (markov.py) with seeds offset .. offset + images - 1 at
temperature 1 with no filter and no guidance (p = softmax of the target's logits, the law
markov.py computes), and its images are judged against the exact law (stats.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from hydra import compose, initialize_config_dir
from hydra.utils import get_object

from harness.__main__ import config_dir
from harness.api import ConfigValueError, Decoder, ModelBundle
from harness.checks import build_decoder
from harness.exactness.markov import MarkovLaw, markov_bundle
from harness.exactness.stats import Null, Verdict, judge

# p = softmax(logits): the law of the Markov target as markov.py computes it
UNFILTERED = ("sampling.temperature=1.0", "sampling.top_k=null", "sampling.top_p=1.0", "sampling.cfg_scale=1.0")
PROMPT = "a markov image"
# the negative controls live with the decoders (baselines/methods/controls.py); the core reaches
# them by name, as the pipeline reaches every decoder through its config's _target_
CONTROLS_AT = "baselines.methods.controls.CONTROLS"


def controls() -> dict:
    """name -> Control (baselines/methods/controls.py)."""
    return get_object(CONTROLS_AT)


@dataclass(frozen=True)
class Target:
    """The Markov bundle, its exact law, and the bootstrap null at `images` images."""

    bundle: ModelBundle
    law: MarkovLaw
    null: Null

    @classmethod
    def make(cls, images: int, rows: int = 6, cols: int = 6, vocab: int = 4, sharpness: float = 2.0,
             seed: int = 0, replicates: int = 200) -> "Target":
        bundle = markov_bundle(rows, cols, vocab, sharpness, seed)
        law = MarkovLaw.of(bundle.target)
        return cls(bundle=bundle, law=law, null=Null.draw(law, images, replicates, seed=seed + 1))

    @property
    def n_tokens(self) -> int:
        rows, cols = self.bundle.target.grid
        return rows * cols


def known(name: str) -> bool:
    return name in controls() or (config_dir() / "decoder" / f"{name}.yaml").is_file()


def decoder(name: str, overrides: Sequence[str], n_tokens: int) -> Decoder:
    """Decoder `name` (a conf/decoder/ file or a control) with `overrides` relative to it
    (e.g. draft.window=8)."""
    if not known(name):
        choices = sorted(p.stem for p in (config_dir() / "decoder").glob("*.yaml")) + sorted(controls())
        raise ConfigValueError(f"exactness: no decoder or control {name!r}; choose one of {', '.join(choices)}")
    control = controls().get(name)
    base = control.base if control else name
    rel = [*(control.overrides if control else ()), *overrides]
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"decoder=[{base}]", "model=random", *UNFILTERED,
                                                       *(f"decoder.{base}.{o}" for o in rel)])
    built = build_decoder(base, cfg.decoder[base])
    return control.breaks(built, n_tokens) if control else built


def measure(name: str, target: Target, overrides: Sequence[str] = (), offset: int = 0) -> Verdict:
    """Decode target.null.images images with decoder `name` and judge them."""
    dec = decoder(name, overrides, target.n_tokens)
    images = target.null.images
    seeds = list(range(offset, offset + images))
    gen = dec.generate(target.bundle, target.bundle.condition([PROMPT] * images), seeds)
    steps = sum(s.target_forwards for s in gen.stats) / images
    return judge(gen.tokens, target.law, target.null, steps)
