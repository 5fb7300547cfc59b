"""benchmarks/mulo.py on a tiny random model: every table is a pipeline run whose printed numbers
are its summary.csv's, the oracle drafter replays D_r of the reference (so at tau = 0 the image is
U_r(D_r(reference))), the diagnosis and frontier rows, and the goal verdict."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from benchmarks.common import compose_config, mirrored
from benchmarks.goal import GOAL_IMAGES, HELD_OUT_SEED, goal_verdict, sample_note
from benchmarks.mulo import DIAGNOSES, FRONTIER, frontier_rows, main, mulo_rows
from benchmarks.oracle import OracleDraft, low_view
from harness.api import Generation
from harness.datasets.prompts import shapes
from harness.run import _build, guided
from harness.store.samples import plan
from tests.single_thread import single_thread  # noqa: F401  (autouse)

TINY = ["model.grid=8", "model.vocab=32", "model.dim=32", "model.n_layer=1", "sampling.cfg_scale=1.5"]


def _summary(run_dir: Path) -> pd.DataFrame:
    frame = pd.read_csv(run_dir / "summary.csv")
    return frame[frame.subset == "all"]


def _value(frame: pd.DataFrame, decoder: str, metric: str) -> float:
    return float(frame[(frame.decoder == decoder) & (frame.metric == metric)].value.iloc[0])


class _Fixed:
    """A 'decoder' that returns fixed tokens (the oracle's reference)."""

    def __init__(self, tokens: torch.Tensor) -> None:
        self.tokens = tokens

    def generate(self, models, cond, seeds) -> Generation:  # type: ignore[no-untyped-def]
        return Generation(tokens=self.tokens[: len(seeds)], stats=[])


def test_oracle_draft_at_tau_zero_is_the_reference_seen_through_the_down_and_up_samplers() -> None:
    cfg = compose_config([*TINY, "decoder.mulo_sd.accept.tau=0.0", "decoder.mulo_sd.draft.upsampler.kind=nearest"],
                         "random")
    decoder = _build(cfg.decoder.mulo_sd)
    models = guided(_build(cfg.model, drop=("name", "sampling")), decoder.sampling)
    reference = torch.randint(0, 32, (3, 64), generator=torch.Generator().manual_seed(0))
    oracle = OracleDraft(decoder, _Fixed(reference))
    out = oracle.generate(models, models.condition([p.text for p in shapes(3)]), [1, 2, 3])
    low = low_view(decoder, models, reference).view(3, 4, 4)
    blocks = reference.view(3, 4, 2, 4, 2).permute(0, 1, 3, 2, 4).reshape(3, 4, 4, 4)
    assert (low[..., None] == blocks).any(-1).all(), "nearest D_r picks a token of each 2 x 2 block"
    expected = low.repeat_interleave(2, 1).repeat_interleave(2, 2).flatten(1)
    assert torch.equal(out.tokens[:, 1:], expected[:, 1:])
    assert all(s.accepted == 63 for s in out.stats)


@pytest.mark.long
def test_diagnosis_rows(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    # tau 0.5: a random model's pooled mass over 16 of 32 codes is about 0.5, so about half the
    # drafts are rejected and the parallel and serial resamplers have work to do
    main(["--model", "random", "--images", "4", "--quality-batch", "2", "--no-main", "--diagnose",
          "--out", str(tmp_path), *TINY, "decoder.mulo_sd.accept.tau=0.5"])
    summary = _summary(tmp_path / "diagnose")
    assert set(summary.decoder) == {"raster", *DIAGNOSES}
    assert _value(summary, "raster", "target_forwards") == 64
    assert "latency_s" not in set(summary.metric), "the diagnosis is untimed"
    raster = _value(summary, "raster", "geneval")
    for name in DIAGNOSES:  # gaps to raster on the same images, paired by sample
        gap = summary[(summary.decoder == name) & (summary.metric == "geneval_gap_vs_raster")].iloc[0]
        assert gap.value == pytest.approx(_value(summary, name, "geneval") - raster) and gap.stderr >= 0
    forwards = {name: _value(summary, name, "target_forwards") for name in DIAGNOSES}
    for label in ("drafter", "oracle", "alone"):
        parallel = {"drafter": "drafter", "oracle": "oracle_draft", "alone": "resampler_alone"}[label]
        assert forwards[f"serial_{label}"] > forwards[parallel], label
    assert forwards["serial_alone"] >= 60, "nearly every position resampled one per forward"
    # a wider resampler window waits longer before each island row starts: more forwards
    assert forwards["window4_alone"] > forwards["resampler_alone"]
    assert _value(summary, "resampler_alone", "acceptance_rate") < _value(summary, "drafter", "acceptance_rate")
    printed = capsys.readouterr().out
    assert "### diagnose (untimed; quality images)" in printed and "| k=1 tau=1 (resampler alone)" in printed


def _row(name: str, target: float, speedup: float, gap: float, noise: float = 0.0, fid: float = 100.0,
         kid: float = 0.05, kid_se: float = 0.001) -> dict[str, object]:
    return {"decoder": name, "target": target, "speedup": speedup, "ci_low": speedup - 0.1,
            "ci_high": speedup + 0.1, "gap": gap, "gap_se": 0.01, "noise": noise, "fid": fid, "kid": kid,
            "kid_se": kid_se}


DETAIL = ", FID 100.0, KID 0.0500 +- 0.0010"


def test_goal_verdict_names_the_rows_that_meet_each_part() -> None:
    rows = [_row("raster", 256, 1.0, 0.0), _row("fast", 36, 3.1, -0.11), _row("close", 77, 2.3, -0.01),
            _row("slow", 130, 1.5, -0.05), _row("both", 60, 3.0, -0.02)]
    met, fastest, best, front = goal_verdict(rows)
    assert met.endswith(f"met by both (3.00x [2.90, 3.10], gap -0.020 +- 0.010{DETAIL})")
    assert fastest.startswith("fastest within the gap: both")
    assert best.startswith("best gap at >= 3x: both")
    # "slow" is beaten on both axes by "close"; "fast" and "both" trade speed against quality
    assert front == (f"Pareto front (speed-up vs gap): fast (3.10x [3.00, 3.20], gap -0.110 +- 0.010{DETAIL}), "
                     f"both (3.00x [2.90, 3.10], gap -0.020 +- 0.010{DETAIL}), "
                     f"close (2.30x [2.20, 2.40], gap -0.010 +- 0.010{DETAIL})")
    met, fastest, best, _ = goal_verdict(rows[:4])
    assert met.endswith("not met by any row")
    assert fastest.startswith("fastest within the gap: close") and best.startswith("best gap at >= 3x: fast")
    # 4x fewer forwards is part of the goal: 3x wall-clock and no gap at 70 of 256 forwards is not it
    assert goal_verdict([rows[0], _row("wide", 70, 3.2, 0.0)])[0].endswith("not met by any row")
    with pytest.raises(ValueError, match="raster row"):
        goal_verdict(rows[1:])


def test_goal_verdict_is_undecided_when_timing_is_unreliable() -> None:
    """Issue 31: a loaded machine printed 'goal: met'; a row with noisy timing decides nothing."""
    rows = [_row("raster", 256, 1.0, 0.0, noise=0.6), _row("both", 60, 55.0, -0.02)]
    head = goal_verdict(rows, noise_threshold=0.1)[0]
    assert "met by" not in head and "undecided, timing unreliable for raster (timing_noise 0.60)" in head
    quiet_enough = goal_verdict(rows, noise_threshold=0.7)[0]
    assert quiet_enough.endswith(f"met by both (55.00x [54.90, 55.10], gap -0.020 +- 0.010{DETAIL})")


def test_goal_needs_geneval_and_image_detail() -> None:
    """Issue 33: a row that keeps GenEval but loses detail (KID and FID far above raster's) does not
    meet the goal, nor does one that keeps detail but loses GenEval; FID within 10% or KID within
    raster's own noise band (raster from another draw of the seeds) counts as detail kept."""
    raster = _row("raster", 256, 1.0, 0.0, fid=100.0, kid=0.050, kid_se=0.002)
    blurry = _row("blurry", 40, 3.5, 0.0, fid=160.0, kid=0.099, kid_se=0.002)
    wrong = _row("wrong", 40, 3.5, -0.10, fid=101.0, kid=0.050, kid_se=0.002)
    assert goal_verdict([raster, blurry])[0].endswith("not met by any row")
    assert goal_verdict([raster, wrong])[0].endswith("not met by any row")
    fid_close = _row("fid_close", 40, 3.5, 0.0, fid=109.0, kid=0.070, kid_se=0.002)
    assert "met by fid_close" in goal_verdict([raster, fid_close])[0]
    kid_noise = _row("kid_noise", 40, 3.5, 0.0, fid=130.0, kid=0.058, kid_se=0.002)
    assert goal_verdict([raster, kid_noise])[0].endswith("not met by any row")  # 0.008 > 2 x 0.0028
    redrawn = _row("raster_redrawn", 256, 1.0, 0.0, fid=104.0, kid=0.060, kid_se=0.002)
    assert "met by kid_noise" in goal_verdict([raster, redrawn, kid_noise])[0]  # raster itself moves 0.010
    assert "raster_redrawn" not in goal_verdict([raster, redrawn, kid_noise])[0]  # a band, not a candidate
    unscored = _row("unscored", 40, 3.5, 0.0, fid=math.nan, kid=math.nan)
    head = goal_verdict([{**raster, "fid": math.nan, "kid": math.nan}, unscored])[0]
    assert "undecided, no FID/KID for unscored" in head


def test_frontier_rows_cross_windows_with_rules() -> None:
    extra, labels = mulo_rows(frontier_rows())
    cfg = compose_config([*TINY, *extra], "random")
    configured = compose_config(TINY, "random").decoder.mulo_sd.accept
    assert (configured.k, configured.tau) != (1, 1.0), "the two rules must differ"
    assert list(cfg.decoder)[0] == "raster" and list(labels)[0] == "raster"
    mulo = {name: cfg.decoder[name] for name in labels if name != "raster"}
    assert len(mulo) == len(FRONTIER["windows"]) * len(FRONTIER["rules"])
    for name, node in mulo.items():
        label = labels[name]
        assert node.resampler.window == int(label.split()[1]), label
        rule = (1, 1.0) if "k=1 tau=1" in label else (configured.k, configured.tau)
        assert (node.accept.k, node.accept.tau) == rule, label
    _, labels = mulo_rows(frontier_rows([0.0, 0.05]))
    assert list(labels.values()) == ["Raster AR", "tau 0", "tau 0.05"]


def test_benchmark_images_default_to_a_seed_no_default_was_chosen_on(capsys) -> None:  # type: ignore[no-untyped-def]
    """The figures of record are drawn at the held-out seed, not at the harness's default (the
    tuning sample), and a Hydra `seed=` override is refused so that the seed has one spelling."""
    assert HELD_OUT_SEED not in (0, 1)
    assert compose_config(TINY, "random").seed != HELD_OUT_SEED
    with pytest.raises(SystemExit):
        main(["--model", "random", "seed=0"])
    assert "--seed N, not a Hydra override" in capsys.readouterr().err


@pytest.mark.long
@pytest.mark.parametrize("argv, seed", [([], HELD_OUT_SEED), (["--seed", "5"], 5)])
def test_the_main_table_is_the_pipeline_run_it_prints(argv: list[str], seed: int, tmp_path: Path,
                                                      capsys) -> None:  # type: ignore[no-untyped-def]
    """The whole benchmark on a tiny random model: one pipeline run at the seed of --seed (the
    held-out one by default), whose summary.csv holds every printed speed-up with its interval."""
    main(["--model", "random", "--images", "2", "--reps", "2", "--out", str(tmp_path), *argv, *TINY])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(f" seed={seed}"), lines[0]
    summary = _summary(tmp_path / "main")
    assert set(summary.decoder) == {"raster", "sjd", "eagle2", "lantern", "zipar", "mulo_sd",
                                    "mulo_sd_anchored"}
    stats = pd.read_csv(tmp_path / "main" / "samples" / "zipar" / "stats.csv")
    assert stats.timed.all() and (stats.batch_size == 1).all()
    assert (stats.latency_reps_s.str.split().str.len() == 2).all()
    speedups = summary[summary.metric == "speedup_vs_raster"].set_index("decoder")
    assert speedups.ci_low.notna().all()
    cells = {line.split("|")[2].strip(): [c.strip() for c in line.split("|")[3:]] for line in lines
             if line.startswith("| ") and line.count("|") > 4}
    for decoder, label in (("zipar", "ZipAR (window=8)"), ("mulo_sd", "MuLo-SD"), ("raster", "Raster AR")):
        row = speedups.loc[decoder]
        assert f"{row.value:.2f}× [{row.ci_low:.2f}, {row.ci_high:.2f}]" in cells[label], (decoder, cells[label])
    # two quality images: the verdict is followed by the warning that it cannot resolve 2 points
    verdict = next(i for i, line in enumerate(lines) if line.startswith("goal ("))
    assert lines[verdict + 1].startswith("note: GenEval on 2 images cannot resolve")
    assert sample_note(GOAL_IMAGES) is None and sample_note(GOAL_IMAGES - 1) is not None
    assert math.isclose(_value(summary, "raster", "speedup_vs_raster"), 1.0)


def test_quality_images_beyond_the_timed_ones_are_decoded_untimed(tmp_path: Path) -> None:
    main(["--model", "random", "--images", "1", "--reps", "1", "--quality-images", "3", "--quality-batch", "2",
          "--no-main", "--frontier", "--out", str(tmp_path), *TINY, "--frontier-taus", "0"])
    stats = pd.read_csv(tmp_path / "frontier" / "samples" / "raster" / "stats.csv")
    assert stats.timed.tolist() == [True, False, False] and stats.batch_size.tolist() == [1, 2, 2]
    summary = _summary(tmp_path / "frontier")
    assert summary[summary.metric == "geneval"].n.eq(3).all() and summary[summary.metric == "latency_s"].n.eq(1).all()
    specs = plan(shapes(3), images_per_prompt=1, global_seed=HELD_OUT_SEED)
    assert sorted(stats.sample_id) == sorted(s.sample_id for s in specs)


def test_no_main_runs_only_the_tables_asked_for(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    main(["--model", "random", "--images", "1", "--reps", "1", "--no-main", "--frontier", "--out", str(tmp_path),
          *TINY, "--frontier-taus", "0"])  # overrides before --frontier-taus, which takes every number after it
    out = capsys.readouterr().out
    assert "### main" not in out and "### frontier" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["frontier"]
    with pytest.raises(SystemExit):
        main(["--model", "random", "--no-main", *TINY])
    assert "--no-main leaves nothing to run" in capsys.readouterr().err


def test_mulo_sd_overrides_reach_every_mulo_row_unless_it_sets_the_key() -> None:
    got = mirrored(["decoder.mulo_sd.draft.window=8", "decoder.mulo_sd_anchored.accept.tau=0.2",
                    "decoder.mulo_sd.accept.tau=0.1", "seed=2"], ["mulo_sd_anchored", "oracle_draft.inner"])
    assert "decoder.mulo_sd_anchored.draft.window=8" in got and "decoder.oracle_draft.inner.draft.window=8" in got
    assert "decoder.mulo_sd_anchored.accept.tau=0.1" not in got, "a key set for the anchored row wins"
    cfg = compose_config(mirrored(["+experiment=main", "decoder.mulo_sd.draft.window=8"], ["mulo_sd_anchored"]),
                         "shapes_x2")
    assert cfg.decoder.mulo_sd_anchored.draft.window == 8 and cfg.decoder.mulo_sd_anchored.accept.anchor == 4
    assert cfg.decoder.mulo_sd.accept.anchor == 0
