"""The paper's table layouts: which experiment feeds each table, its metric columns and row labels.

Tables key on the `experiment` column, the `decoder` name (the key under `decoder:` in the
experiment's config, e.g. `mulo_l3` in ablation_local) and the experiment's swept keys (extra result
columns such as `decoder.mulo_sd.accept.tau`). Decoders a spec does not list still get a row, under
their config name, after the listed ones.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

MISSING = "—"


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric column.

    key: column id, also the `metric` of the paper's facts (harness/data/paper_numbers.csv).
    metric, subset: where the value is in the results (summary.csv `metric`, `subset`).
    scale: factor from the harness's unit to the shown unit (GenEval fraction -> percent).
    error: show the value's standard error ("value ± stderr") where the results give one.
    definition: what the column holds, in the shown unit (the report's legend and header tooltip).
    dataset: take the value only from rows of this prompt set (summary.csv `dataset`; None: any), for
        tables whose columns come from different protocols (the field's: speed on one, GenEval on another).
    """

    key: str
    label: str
    metric: str
    subset: str = "all"
    scale: float = 1.0
    decimals: int = 1
    higher_is_better: bool = True
    suffix: str = ""
    error: bool = False
    definition: str = ""
    dataset: str | None = None


@dataclass(frozen=True, slots=True)
class TableSpec:
    """One table.

    name: file stem of the written table and the experiment whose report shows it.
    experiments: the `experiment` values whose rows fill it.
    methods: (decoder, label) in the paper's row order.
    paper_table: the `table` of the paper's facts shown beside ours (None: the paper has no numbers).
    note: what the paper concludes (shown under the table).
    drop_empty_metrics: leave out metric columns no row has a value for (generic tables).
    published_rows: the facts of `paper_table` are rows of their own (their models are not the
        harness's: the field's methods publish on Lumina-mGPT and Emu3), shown before the harness's
        rows in one column per metric, instead of a paper column and Δ beside each of our values.
    """

    name: str
    title: str
    experiments: tuple[str, ...]
    metrics: tuple[MetricSpec, ...]
    methods: tuple[tuple[str, str], ...] = ()
    paper_table: str | None = None
    note: str = ""
    drop_empty_metrics: bool = False
    published_rows: bool = False


SPEEDUP = MetricSpec("speedup", "Speed-up", "speedup_vs_raster", decimals=2, suffix="×", definition=(
    "raster AR's median decode latency per image divided by the method's, both timed in the same run "
    "(speedup_vs_raster); [low, high]: its 95% interval, a bootstrap over the timed images and their "
    "repeated decodes, paired with raster."))
GENEVAL = MetricSpec("geneval", "GenEval", "geneval", scale=100.0, definition=(
    "GenEval overall score, %: the share of images that meet every clause of their prompt (objects, "
    "counts, colours, positions), averaged over the prompt tags with equal weight (geneval; on the "
    "shapes worlds judged by the shapes detector)."))
DPG_BENCH = MetricSpec("dpg_bench", "DPG-Bench", "dpg_bench", definition=(
    "DPG-Bench score: the share of a dense prompt's questions the VQA judge answers yes to, averaged "
    "over prompts (dpg_bench)."))
FID = MetricSpec("fid", "FID", "fid", higher_is_better=False, definition=(
    "Fréchet Inception distance between the method's images and the reference images (fid; lower is "
    "closer)."))
HPSV2 = MetricSpec("hpsv2", "HPSv2", "hpsv2", definition=(
    "Human Preference Score v2 of the images for their prompts, mean over images (hpsv2)."))
ACCEPTANCE = MetricSpec("acceptance_rate", "Drafts kept", "acceptance_rate", scale=100.0, suffix="%", definition=(
    "drafted tokens the target verified and kept unchanged, % of the drafted tokens it verified "
    "(acceptance_rate = accepted / proposed, summed over the images that drafted). One quantity for "
    "every drafting method, but not a per-draft acceptance probability: a draft tree (EAGLE-2, "
    "LANTERN) verifies every node of every branch and keeps at most one path, so its share is low "
    "even when it keeps 5 tokens a round (compare methods' rounds by Step compr.). Methods that draft "
    "nothing (raster AR, ZipAR) have none."))
STEP_COMPRESSION = MetricSpec("step_compression", "Step compr.", "step_compression", decimals=2, definition=(
    "tokens per target forward: an image's tokens over its target forwards (ratio of sums; raster AR "
    "1.00; step_compression)."))
LATENCY = MetricSpec("latency_s", "Latency (s)", "latency_s", decimals=3, higher_is_better=False, definition=(
    "median decode time per image, seconds, of the timed batch that made it, at timing.batch_size "
    "(condition and tokens-to-pixels stages excluded; latency_s)."))
TARGET_FORWARDS = MetricSpec("target_forwards", "Target fwd", "target_forwards", higher_is_better=False,
                             definition=("target-model forwards per image, mean (a batched forward counts once "
                                         "for every image in it; raster AR: one per token; target_forwards)."))
DRAFTER_FORWARDS = MetricSpec("drafter_forwards", "Drafter fwd", "drafter_forwards", higher_is_better=False,
                              definition=("drafter forwards per image, mean: the EAGLE head of a tree method, "
                                          "the drafting model of MuLo-SD and draft-model SD; 0 for methods "
                                          "without one (drafter_forwards)."))
CLIP_SCORE = MetricSpec("clip_score", "CLIP score", "clip_score", decimals=2, definition=(
    "CLIP score of the images for their prompts, mean over images (clip_score)."))

SPEEDUP_VS_LANTERN = MetricSpec("speedup_vs_lantern", "Speed-up vs LANTERN", "speedup_vs_lantern", decimals=2,
                                suffix="×", definition=(
    "LANTERN's median decode latency per image divided by the method's, both timed in the same job "
    "on the same images (speedup_vs_lantern, harness/report/matched.py); [low, high]: its 95% "
    "bootstrap interval, paired over the timed images and their repeated decodes."))
GAP_TO_LANTERN = MetricSpec("geneval_gap_vs_lantern", "GenEval gap to LANTERN", "geneval_gap_vs_lantern",
                            scale=100.0, error=True, definition=(
    "GenEval of the method minus LANTERN's on the same images, points (geneval_gap_vs_lantern); ± its "
    "paired standard error (per tag, the per-image differences of the two verdicts)."))
TIMING_NOISE = MetricSpec("timing_noise", "Timing noise", "timing_noise", decimals=2, higher_is_better=False,
                          definition=(
    "share of the timed decodes' time other processes held the CPU or the decoding thread was off it "
    "(timing_noise; about 0.01 on a quiet machine; above timing.noise_threshold the speed-ups are not "
    "to be trusted, docs/methodology.md)."))

ALL_METRICS = (SPEEDUP, LATENCY, ACCEPTANCE, STEP_COMPRESSION, TARGET_FORWARDS, DRAFTER_FORWARDS,
               GENEVAL, DPG_BENCH, FID, HPSV2, CLIP_SCORE)

METHOD_LABELS = {
    "raster": "Raster AR",
    "eagle2": "EAGLE-2",
    "sjd": "SJD",
    "sd": "Draft-model SD",
    "lantern": "LANTERN",
    "lantern_chain": "LANTERN (small-GPT chain)",
    "gsd": "GSD",
    "lantern_pp": "LANTERN++",
    "zipar": "ZipAR",
    "zipar_w4": "ZipAR (window 4)",
    "mulo_sd": "MuLo-SD",
    "sjd_pac": "SJD-PAC",
    "scd": "SCD",
    "sjd_entropy": "SJD + entropy-aware acceptance",
}
MODEL_LABELS = {"shapes": "Shapes (embedded)", "shapes_x2": "Shapes x2 (embedded, 32x32)", "random": "Random (smoke)"}
SWEPT_LABELS = {"tau": "τ", "k": "k", "radius": "l", "delta": "δ", "window": "window"}

MAIN = TableSpec(
    name="main",
    title="Main results: speed-up and quality per model and method (paper Table 1)",
    experiments=("main",),
    metrics=(SPEEDUP, GENEVAL, DPG_BENCH, FID, HPSV2),
    methods=(("raster", "Raster AR"), ("eagle2", "EAGLE-2"), ("sjd", "SJD"), ("sd", "Draft-model SD"),
             ("zipar", "ZipAR"), ("lantern", "LANTERN"), ("mulo_sd", "MuLo-SD")),
    paper_table="main",
    note="Paper values: harness/data/paper_numbers.csv (reference/paper.md §10.1, secondary notes of "
         "the CVPR version). Methods run at different operating points (τ chosen so GenEval is close "
         "to LANTERN's); read quality together with speed.",
)

UPSAMPLING = TableSpec(
    name="ablation_upsampling",
    title="Ablation (a): up-sampling design",
    experiments=("ablation_upsampling",),
    metrics=(SPEEDUP, ACCEPTANCE, GENEVAL, FID),
    methods=(("raster", "Raster AR (reference)"), ("mulo_nearest", "Token replication (nearest)"),
             ("mulo_learned_ce", "Learned latent, token CE"),
             ("mulo_learned_pixel", "Learned latent, pixel MSE + LPIPS"),
             ("mulo_learned_gan", "Learned latent, + PatchGAN"),
             ("mulo_sd", "Pixel-space resize / SR (training-free, default)")),
    note="Paper (§10.2, qualitative): token CE loss gives poor images; a pixel reconstruction loss is a "
         "large gain; PatchGAN adds high-frequency detail; off-the-shelf pixel SR is slightly worse "
         "than the best learned up-sampler but training-free, hence the default.",
)

POOLING = TableSpec(
    name="ablation_pooling",
    title="Ablation (b): probability pooling (codebook neighbourhood k, threshold τ)",
    experiments=("ablation_pooling",),
    metrics=(SPEEDUP, ACCEPTANCE, STEP_COMPRESSION, GENEVAL),
    methods=(("raster", "Raster AR (reference)"), ("mulo_sd", "MuLo-SD")),
    note="Paper (§10.2, qualitative): pooling over the k nearest codebook entries (k > 1) raises "
         "acceptance over the draft-token probability alone (k = 1) and is more stable above 1.2× "
         "speed-up; the gain is limited because τ is the main relaxation knob.",
)

LOCAL = TableSpec(
    name="ablation_local",
    title="Ablation (c): local rejection and neighbourhood radius l",
    experiments=("ablation_local",),
    metrics=(SPEEDUP, ACCEPTANCE, STEP_COMPRESSION, GENEVAL),
    methods=(("raster", "Raster AR (reference)"), ("mulo_raster_scope", "Raster-scan rejection"),
             ("mulo_l0", "Local, l = 0 (naive)"), ("mulo_l1", "Local + expansion, l = 1"),
             ("mulo_l2", "Local + expansion, l = 2"), ("mulo_l3", "Local + expansion, l = 3"),
             ("mulo_l4", "Local + expansion, l = 4"), ("mulo_after_t0", "Local, everything after t0"),
             ("mulo_sd", "MuLo-SD (default)")),
    note="Paper (§10.2, qualitative): raster-scan rejection needs a very low τ (poor quality); naive "
         "local (l = 0) is even worse; local rejection with expansion is faster at the same τ and "
         "keeps quality; l = 3 gave the best GenEval (v1).",
)

PARALLEL = TableSpec(
    name="ablation_parallel",
    title="Ablation (d): serial vs parallel drafting and resampling",
    experiments=("ablation_parallel",),
    metrics=(LATENCY, SPEEDUP, TARGET_FORWARDS, DRAFTER_FORWARDS, GENEVAL, FID),
    methods=(("raster", "Raster AR (reference)"), ("mulo_serial_serial", "Serial drafting + serial resampling"),
             ("mulo_serial_parallel", "Serial drafting + parallel resampling"),
             ("mulo_zipar_serial", "ZipAR drafting + serial resampling"),
             ("mulo_resample_w4", "ZipAR drafting + island-parallel resampling, window 4"),
             ("mulo_resample_w8", "ZipAR drafting + island-parallel resampling, window 8"),
             ("mulo_sd", "ZipAR drafting + island-parallel resampling (default, window 2)")),
    note="Paper (§10.2, qualitative): parallel drafting and island-parallel resampling consistently "
         "lower latency at the same τ with almost unchanged metrics.",
)

MATCHED_TABLE = "mulo_at_lantern_geneval"  # the rows harness/report/matched.py derives from the sweeps
MATCHED_DECODER = "mulo_sd_matched"
MATCHED = TableSpec(
    name=MATCHED_TABLE,
    title="MuLo-SD at LANTERN's GenEval: τ swept, the point closest to LANTERN's GenEval (paper §5)",
    experiments=(MATCHED_TABLE,),
    metrics=(SPEEDUP, SPEEDUP_VS_LANTERN, GENEVAL, GAP_TO_LANTERN, TARGET_FORWARDS, TIMING_NOISE),
    methods=(("raster", "Raster AR"), ("lantern", "LANTERN"), ("mulo_sd", "MuLo-SD"),
             (MATCHED_DECODER, "MuLo-SD at LANTERN's GenEval")),
    note="The paper does not give τ: it sweeps τ and reports MuLo-SD where its GenEval is closest to "
         "LANTERN's, then compares speed (reference/paper.md §5). Rows from experiments matched_quality "
         "and paper_matched_quality; raster and LANTERN from the chosen τ's job. Equal distances go to the "
         "higher GenEval, then the larger τ; the label names every τ within one paired standard error "
         "of LANTERN's GenEval (harness/report/matched.py).",
)

FIELD_METHODS = (("raster", "Raster AR"), ("sjd", "SJD"), ("sjd_pac", "SJD-PAC"), ("scd", "SCD"), ("gsd", "GSD"),
                 ("lantern_pp", "LANTERN++"), ("sjd_entropy", "SJD + entropy-aware acceptance"),
                 ("eagle2", "EAGLE-2"), ("lantern", "LANTERN"), ("zipar", "ZipAR-16"), ("mulo_sd", "MuLo-SD"))
FIELD_NOTE = ("Published rows (model marked \"published\"): the numbers SJD-PAC's README reports on Lumina-mGPT and "
              "Emu3, each with its source in harness/data/field_numbers.csv and the sources CSV; the methods' own "
              "papers (GSD, SCD, LANTERN++) are not transcribed. Harness rows: this harness's runs of experiment "
              "field; published and harness rows run different models, so compare ratios (Step, Latency), not "
              "absolute FID or CLIP across them. GenEval: the harness rows' protocol=geneval run (docs/field.md).")


def field_spec(name: str, dataset: str, benchmark: str) -> TableSpec:
    """A field table on one benchmark: SJD-PAC's columns (step compression, latency speed-up, FID,
    CLIP) from the field runs on `dataset`, plus GenEval from the protocol=geneval run."""
    step = replace(STEP_COMPRESSION, label="Step", suffix="×", dataset=dataset, definition=(
        "step compression: an image's tokens over its target forwards (raster AR 1.00×; step_compression)."))
    latency = replace(SPEEDUP, label="Latency", dataset=dataset, definition=(
        "latency speed-up: raster AR's median decode latency per image over the method's, both timed at "
        "batch 1 in the same run (speedup_vs_raster), as SJD-PAC's Latency column."))
    quality = (replace(FID, decimals=2, dataset=dataset), replace(CLIP_SCORE, label="CLIP", dataset=dataset, definition=(
        "CLIP score, 100 × cosine of image and prompt, mean over images (clip_score; the field protocols use "
        "OpenAI's ViT-B/16 as SJD-PAC does).")))
    return TableSpec(name=name, title=f"The field beside MuLo-SD on {benchmark} (SJD-PAC's layout)",
                     experiments=("field",), metrics=(step, latency, *quality, replace(GENEVAL, dataset="geneval")),
                     methods=FIELD_METHODS, paper_table=name, note=FIELD_NOTE, published_rows=True)


FIELD_COCO = field_spec("field_coco", "coco5k", "MS-COCO 2017")
FIELD_PARTI = field_spec("field_parti", "parti", "PartiPrompts")

TABLES: dict[str, TableSpec] = {spec.name: spec for spec in
                               (MAIN, UPSAMPLING, POOLING, LOCAL, PARALLEL, MATCHED, FIELD_COCO, FIELD_PARTI)}


def generic_spec(experiment: str) -> TableSpec:
    """The table of an experiment the paper has no table for: every known metric, default labels."""
    return TableSpec(name=experiment, title=f"Experiment {experiment}", experiments=(experiment,),
                     metrics=ALL_METRICS, methods=tuple(METHOD_LABELS.items()), drop_empty_metrics=True)


def spec_for(experiment: str) -> TableSpec:
    """The paper's table for `experiment`, or a generic one."""
    return TABLES.get(experiment) or generic_spec(experiment)


def swept_label(column: str) -> str:
    """Header of a swept-key column: its last dotted part, Greek where the paper uses it."""
    last = column.rsplit(".", 1)[-1]
    return SWEPT_LABELS.get(last, last)


def tables_help() -> str:
    """One line per paper table: name and title (for --help and errors)."""
    return "; ".join(f"{name}: {spec.title}" for name, spec in TABLES.items())
