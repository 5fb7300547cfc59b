"""`python -m harness.exactness DECODER [KEY=VALUE ...]`: check a decoder's lossless claim on the
Markov target (docs/field.md, "Exactness with length").

DECODER is a file of conf/decoder/ (sjd, scd, sjd_pac, gsd, raster, ...), a negative control of
baselines/methods/controls.py, or `all` (the decoders and controls of docs/field.md's table);
KEY=VALUE overrides are relative to the decoder (draft.window=8, draft.coupling=maximal). Prints one
table row per decoder: mean target forwards, the TVD sums with their bootstrap z and p, the
Bonferroni-adjusted chi-square p of the adjacent pairs, the failing pairs and the verdict.
`--repeats R` decodes R disjoint blocks of seeds and reports how many failed (a control's power).
"""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

from harness.api import ConfigValueError
from harness.exactness.check import Target, controls, measure
from harness.exactness.stats import ALPHA, Z_MAX, Verdict

log = logging.getLogger("harness.exactness")

# `all`: every lossless decoder (and the settings that make one lossless), then gsd at its
# defaults (lossy), then the controls
ALL: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("raster", ()), ("sjd", ()), ("sjd", ("draft.head=3", "draft.tail=10")),
    ("scd", ()), ("scd", ("draft.coupling=maximal",)), ("scd", ("draft.head=3", "draft.tail=10")),
    ("sjd_pac", ()), ("sjd_pac", ("draft.head=3", "draft.tail=10")),
    ("gsd", ("accept.rank_window=0",)), ("sd", ()), ("gsd", ()),
    *((name, ()) for name in ("scd_one_noise_row", "scd_tail_noise", "scd_released_maximal", "sjd_wrong_residual",
                              "sjd_pac_longest_path")),
)
HEADER = ("| decoder | target fwd | pos TVD (z, p) | pair TVD (z, p) | pair chi2 p (Bonferroni) | failing pairs "
          "| verdict |\n|---|---:|---|---|---:|---|---|")


def row(label: str, verdicts: Sequence[Verdict]) -> str:
    """One Markdown row: the first block's figures, and with repeats the failures out of R."""
    v = verdicts[0]
    failing = ", ".join(str(i) for i in v.failing_pairs[:8]) + (" ..." if len(v.failing_pairs) > 8 else "")
    verdict = "pass" if v.passed else "FAIL"
    if len(verdicts) > 1:
        zs = [x.pair_z for x in verdicts]
        verdict += (f" ({sum(not x.passed for x in verdicts)}/{len(verdicts)} blocks fail; pair z {min(zs):+.1f} .. "
                    f"{max(zs):+.1f}, largest chi2 p {max(x.chi2_p for x in verdicts):.2g})")
    return (f"| {label} | {v.steps:.1f} | {v.marginal_tvd:.3f} ({v.marginal_z:+.1f}, {v.marginal_p:.3f}) "
            f"| {v.pair_tvd:.3f} ({v.pair_z:+.1f}, {v.pair_p:.3f}) | {v.chi2_p:.2g} | {failing or '-'} | {verdict} |")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.exactness", description=__doc__.split("\n\n")[0])
    ap.add_argument("decoder", help="a conf/decoder/ name, a control (" + ", ".join(controls()) + ") or all")
    ap.add_argument("overrides", nargs="*", help="KEY=VALUE relative to the decoder (e.g. draft.window=8)")
    ap.add_argument("--images", type=int, default=3000, help="images per block (default 3000)")
    ap.add_argument("--repeats", type=int, default=1, help="disjoint seed blocks (default 1)")
    ap.add_argument("--replicates", type=int, default=200, help="bootstrap replicates of the null (default 200)")
    ap.add_argument("--rows", type=int, default=6)
    ap.add_argument("--cols", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0, help="the Markov target's seed (default 0)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.images < 50 or args.repeats < 1 or args.replicates < 20:
            raise ConfigValueError(f"exactness: --images must be >= 50, --repeats >= 1 and --replicates >= 20 "
                                   f"(got {args.images}, {args.repeats}, {args.replicates})")
        if args.decoder == "all" and args.overrides:
            raise ConfigValueError("exactness: `all` takes no overrides; name one decoder to override it")
        target = Target.make(args.images, args.rows, args.cols, args.vocab, seed=args.seed,
                             replicates=args.replicates)
        jobs = ALL if args.decoder == "all" else ((args.decoder, tuple(args.overrides)),)
        print(f"Markov target {args.rows}x{args.cols}, {args.vocab} codes, seed {args.seed}; {args.images} images "
              f"per block, {args.repeats} block(s); fail: chi2 p < {ALPHA:g} or z > {Z_MAX:g}")
        print(HEADER)
        for name, overrides in jobs:
            verdicts = [measure(name, target, overrides, offset=r * args.images) for r in range(args.repeats)]
            print(row(" ".join([name, *overrides]), verdicts), flush=True)
    except ConfigValueError as err:
        log.error("%s", err)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
