"""Merge the summary.csv tables of runs and show them as one Markdown table.

    python -m harness.results results/main results/ablation_pooling

prints decoders as rows and metrics as columns (subset "all").

A run whose run.json records no final row count (`summary_rows`: written when the job ends) was
killed during evaluation, or is still running: its summary.csv holds the rows written so far, not
the run's result. It is refused, naming the run and the fix, unless `--partial` (`load(...,
partial=True)`) asks for it; then its rows are read and labelled partial. A summary.csv without a
run.json beside it (a table written by hand) is read as it is.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from harness.api import METRIC_COLUMNS, SETTING_COLUMN, InputError
from harness.store.samples import write_atomic

log = logging.getLogger(__name__)

SUMMARY_NAME = "summary.csv"
META_NAME = "summary.meta.json"  # row count and sha256 of summary.csv, written with it
_BULKY_DIRS = frozenset({"images", "records", ".hydra"})  # never hold a summary; skip the walk
_MISSING = "-"


def find_summaries(paths: Sequence[Path | str]) -> list[Path]:
    """Return every summary.csv under `paths` (directories, searched recursively, or the files)."""
    found: list[Path] = []
    for path in map(Path, paths):
        if not path.exists():
            raise FileNotFoundError(f"run directory {path} does not exist")
        if path.is_file():
            if path.name != SUMMARY_NAME:
                raise ValueError(f"{path} is not a {SUMMARY_NAME}; pass run directories")
            found.append(path)
            continue
        for folder, subfolders, files in os.walk(path):
            subfolders[:] = sorted(d for d in subfolders if d not in _BULKY_DIRS)
            if SUMMARY_NAME in files:
                found.append(Path(folder) / SUMMARY_NAME)
    unique = {p.resolve(): p for p in found}  # a file reached through two arguments counts once
    return list(unique.values())


class SummaryFileError(InputError, ValueError):
    """A summary.csv that is not a complete, well-formed summary table."""


class IncompleteRunError(SummaryFileError):
    """A run whose run.json records no final row count: its summary.csv is not the run's result."""


RUN_JSON = "run.json"


def incomplete_reason(summary_path: Path) -> str | None:
    """Why the run of `summary_path` is not complete, from the run.json beside it, or None (complete,
    or no run.json to tell)."""
    run_json = Path(summary_path).with_name(RUN_JSON)
    try:
        record = json.loads(run_json.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        return f"its {RUN_JSON} cannot be read ({type(err).__name__})"
    extra = record.get("extra") if isinstance(record, dict) else None
    extra = extra if isinstance(extra, dict) else {}
    rows = extra.get("summary_rows")
    if rows is None:
        plan = extra.get("plan") if isinstance(extra.get("plan"), dict) else {}
        planned = plan.get("decoders") if isinstance(plan, dict) else None
        plans = f"plans decoders {', '.join(map(str, planned))} but " if planned else ""
        return (f"its {RUN_JSON} {plans}records no final row count, so the run was killed during evaluation "
                "or is still running")
    return None


def incomplete_runs(paths: Sequence[Path | str]) -> list[tuple[Path, str]]:
    """(run folder, why) of every incomplete run among the summary.csv files under `paths`."""
    found = []
    for file in find_summaries([paths] if isinstance(paths, (str, Path)) else paths):
        reason = incomplete_reason(file)
        if reason is not None:
            found.append((file.parent, reason))
    return found


def write_summary(path: Path | str, frame: pd.DataFrame) -> None:
    """Write `frame` to `path` (summary.csv) atomically, with its row count and sha256 in the
    sidecar `summary.meta.json`, written first, so `read_summary` notices a truncated or
    replaced table."""
    path = Path(path)
    data = frame.to_csv(index=False).encode("utf-8")
    meta = {"rows": len(frame), "columns": list(map(str, frame.columns)),
            "sha256": hashlib.sha256(data).hexdigest()}
    write_atomic(path.with_name(META_NAME), json.dumps(meta, indent=1).encode())
    write_atomic(path, data)


def read_summary(path: Path | str) -> pd.DataFrame:
    """Read and validate one summary.csv.

    Checks: it parses as CSV; it has the METRIC_COLUMNS; `value` and `stderr` are numbers (NaN
    allowed), `n` is a whole number, `higher_is_better` is true/false, `metric` is never empty; and,
    when the sidecar summary.meta.json exists, the row count and sha256 recorded when it was
    written (`_check_unchanged`). Without the sidecar, a file that does not end with a line break
    is refused (cut inside a row); a cut on a line end cannot be told from a shorter table, so such
    a table is read with a warning that its rows cannot be verified.

    Raises:
        SummaryFileError: naming the file and what is wrong with it.
    """
    path = Path(path)
    fix = "rerun the evaluate stage of that run (stages=[evaluate]) to write it again"
    try:
        frame = pd.read_csv(path, dtype={"metric": str, "subset": str})
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise SummaryFileError(f"{path} is not a readable CSV ({type(err).__name__}: "
                               f"{str(err).strip()[:200]}); {fix}") from err
    missing = [c for c in METRIC_COLUMNS if c not in frame.columns]
    if missing:
        raise SummaryFileError(f"{path} is not a summary table: it lacks the columns {missing}; {fix}")
    _check_column_types(path, frame, fix)
    _check_unchanged(path, frame, fix)
    return frame


def _check_unchanged(path: Path, frame: pd.DataFrame, fix: str) -> None:
    """SummaryFileError unless `path` (read as `frame`) is the table its sidecar recorded: the same
    row count and the same bytes (sha256). Without a sidecar only a missing final line break shows
    a cut (pandas reads a row cut among its last cells without a word); the rest is unverifiable,
    and said so in a warning."""
    meta = _read_meta(path)
    data = path.read_bytes()
    if meta is None:
        if not data.endswith(b"\n"):
            raise SummaryFileError(f"{path} does not end with a line break: it was cut short inside its "
                                   f"last row, and it has no {META_NAME} to check it against; {fix}")
        log.warning("%s has no %s: its rows cannot be verified (a table cut on a line end reads as a "
                    "shorter one); %s", path, META_NAME, fix)
        return
    if "sha256" not in meta:
        log.warning("%s records no sha256 of %s: its content cannot be verified (a changed row reads as "
                    "the run's); %s", path.with_name(META_NAME), path.name, fix)
    if meta.get("rows") != len(frame):
        raise SummaryFileError(f"{path} has {len(frame)} rows but {meta.get('rows')} were written "
                               f"({META_NAME}): it was truncated or cut short; {fix}")
    if "sha256" in meta and hashlib.sha256(data).hexdigest() != meta["sha256"]:
        raise SummaryFileError(f"{path} was changed after it was written: its sha256 is not the one "
                               f"{META_NAME} recorded (same row count, other content); {fix}. To read an "
                               f"edited table on purpose, delete {META_NAME}: it is then read unverified")


def _check_column_types(path: Path, frame: pd.DataFrame, fix: str) -> None:
    """SummaryFileError unless every column holds values of its type."""
    for column in ("value", "stderr", "n"):
        numbers = pd.to_numeric(frame[column], errors="coerce")
        bad = frame[column].notna() & numbers.isna()
        if column == "n":
            bad |= numbers.notna() & (numbers != numbers.round())
        if bad.any():
            row = int(bad.to_numpy().nonzero()[0][0])
            raise SummaryFileError(f"{path}: column {column!r} holds {frame[column].iloc[row]!r} on data row "
                                   f"{row + 1}, not a {'whole ' if column == 'n' else ''}number; {fix}")
    flags = frame["higher_is_better"].astype(str).str.strip().str.lower()
    bad = ~flags.isin({"true", "false", "1", "0", "1.0", "0.0"})
    if bad.any():
        row = int(bad.to_numpy().nonzero()[0][0])
        value = frame["higher_is_better"].iloc[row]
        raise SummaryFileError(f"{path}: column 'higher_is_better' holds {value!r} on data row {row + 1}, "
                               f"not true/false; {fix}")
    empty = frame["metric"].isna() | (frame["metric"].astype(str).str.strip() == "")
    if empty.any():
        row = int(empty.to_numpy().nonzero()[0][0])
        raise SummaryFileError(f"{path}: data row {row + 1} has no metric; {fix}")


def _read_meta(path: Path) -> dict | None:
    """The sidecar of `path`, or None when there is none (tables written before it existed)."""
    meta_path = path.with_name(META_NAME)
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise SummaryFileError(f"{meta_path}, the row count of {path}, is corrupt ({err}); rerun the "
                               "evaluate stage of that run to write both again") from err
    if not isinstance(meta, dict):
        raise SummaryFileError(f"{meta_path}, the row count of {path}, is corrupt (not a JSON object); "
                               "rerun the evaluate stage of that run to write both again")
    rows = meta.get("rows")
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        raise SummaryFileError(f"{meta_path}, the row count of {path}, is malformed: 'rows' must be a "
                               f"whole number, got {rows!r}; rerun the evaluate stage of that run to "
                               "write both again")
    return meta


def load(paths: Sequence[Path | str], partial: bool = False) -> pd.DataFrame:
    """Concatenate the summary.csv files under `paths`, adding the `run_dir` each came from.
    `partial`: read incomplete runs too (their rows so far; a warning names each).

    Raises:
        FileNotFoundError: a path does not exist, or no summary.csv is found.
        SummaryFileError: a summary.csv is unreadable, truncated or malformed (read_summary).
        IncompleteRunError: a run's run.json records no final row count, unless `partial`.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    files = find_summaries(paths)
    if not files:
        raise FileNotFoundError(
            f"no {SUMMARY_NAME} found under {', '.join(map(str, paths))}; pass run directories "
            "written by `python -m harness` (results/<name>/<time>) whose evaluate stage has run"
        )
    for file in files:
        reason = incomplete_reason(file)
        if reason is None:
            continue
        if not partial:
            raise IncompleteRunError(
                f"run {file.parent} is incomplete: {reason}; its {SUMMARY_NAME} holds only the rows written so "
                "far. Finish it (rerun its evaluate stage, stages=[evaluate] with its samples_dir), or pass "
                "--partial to read those rows labelled partial")
        log.warning("run %s is incomplete: %s. Its rows are read as PARTIAL", file.parent, reason)
    frames = [read_summary(file).assign(run_dir=str(file.parent)) for file in files]
    return pd.concat(frames, ignore_index=True)


def partial_label(paths: Sequence[Path | str]) -> str:
    """Lines (Markdown quotes) naming every incomplete run under `paths`, or ""."""
    return "".join(f"> PARTIAL: run {folder} is incomplete: {why}. Its rows are those written so far.\n"
                   for folder, why in incomplete_runs(paths))


def pivot(
    df: pd.DataFrame,
    index: Sequence[str] = ("model", "decoder"),
    columns: str | Sequence[str] = "metric",
    values: str = "value",
    subset: str | None = "all",
) -> pd.DataFrame:
    """Return a wide table: one row per `index` key, one column per `columns` key.

    Rows and columns keep the order in which they first appear in `df`. `subset=None` keeps every
    subset (then pass columns=("metric", "subset")).

    Raises:
        KeyError: a named column is not in `df`.
        ValueError: two rows share a cell, e.g. two runs that differ only in a swept key that is
            not part of `index`.
    """
    index, columns = _names(index), _names(columns)
    keys = index + columns
    absent = [c for c in [*keys, values] if c not in df.columns]
    if absent:
        raise KeyError(f"columns {absent} are not in the results; available: {list(df.columns)}")
    frame = df if subset is None else df[df["subset"] == subset]
    if frame.empty:
        present = sorted(df["subset"].dropna().astype(str).unique()) if "subset" in df else []
        raise ValueError(f"no result rows for subset {subset!r}; subsets present: {present}")
    frame = frame.assign(**{c: frame[c].fillna(_MISSING) for c in keys})
    clashes = frame[frame.duplicated(keys, keep=False)]
    if not clashes.empty:
        first = clashes.iloc[0]
        sources = sorted(set(clashes.get("run_dir", pd.Series(dtype=str)).astype(str)))
        raise ValueError(
            f"{len(clashes)} rows share a table cell, e.g. {dict(first[keys])} (runs "
            f"{sources[:4]}); add the key that tells them apart to index (e.g. a swept key), "
            "pass columns=('metric', 'subset'), or load only the runs to compare"
        )
    wide = frame.pivot(index=index, columns=columns, values=values)
    return wide.reindex(index=_first_seen(frame, index), columns=_first_seen(frame, columns))


def format_table(
    df: pd.DataFrame,
    index: Sequence[str] = ("model", "decoder"),
    columns: str | Sequence[str] = "metric",
    subset: str | None = "all",
) -> str:
    """Return `df` (long, as from `load`) as a compact Markdown table.

    Metric columns are marked with the better direction (up or down arrow) when `df` says it, and
    each column gets the decimals that show about four significant digits of its largest value.
    A value with a confidence interval (columns ci_low, ci_high: speed-ups) is shown as
    "value [low, high]".
    """
    wide = pivot(df, index=index, columns=columns, subset=subset)
    with_ci = {"ci_low", "ci_high"} <= set(df.columns) and df["ci_low"].notna().any()
    low, high = ((pivot(df, index=index, columns=columns, values=c, subset=subset)
                  for c in ("ci_low", "ci_high")) if with_ci else (None, None))
    # The arrow belongs to the metric, the first column key when columns start with "metric".
    directions = _directions(df) if _names(columns)[0] == "metric" else {}
    headers = [
        *wide.index.names,
        *(f"{_label(k)} {directions.get(str(_as_tuple(k)[0]), '')}".strip() for k in wide.columns),
    ]
    cells = [[str(k) for k in _as_tuple(key)] for key in wide.index]
    for key in wide.columns:
        column = pd.to_numeric(wide[key], errors="coerce")
        decimals = _decimals(column)
        for i, (row, value) in enumerate(zip(cells, column)):
            row.append(_MISSING if pd.isna(value) else f"{value:.{decimals}f}")
            if low is not None and high is not None and pd.notna(value):
                lo = pd.to_numeric(low[key], errors="coerce").iloc[i]
                hi = pd.to_numeric(high[key], errors="coerce").iloc[i]
                if pd.notna(lo) and pd.notna(hi):
                    row[-1] += f" [{lo:.{decimals}f}, {hi:.{decimals}f}]"
    return _markdown(headers, cells, numeric_from=len(wide.index.names))


# The terminal's headline table: at most HEADLINE_COLUMNS columns, the decoder first, then these
# metrics (subset "all") in this order when the run has them: (metric, header, decimals, show
# "± stderr").
HEADLINE_METRICS = (
    ("target_forwards", "target fwd", 1, False), ("speedup_vs_raster", "speed-up (decode)", 2, True),
    ("geneval", "GenEval", 3, False), ("geneval_gap_vs_raster", "gap to raster", 3, True),
    ("dpg_bench", "DPG-Bench", 2, False), ("fid", "FID", 1, False), ("kid", "KID", 4, True),
    ("hpsv2", "HPSv2", 2, False),
)
HEADLINE_COLUMNS = 8


def headline(df: pd.DataFrame) -> str:
    """The few numbers a reader looks at first, one row per decoder, as a Markdown table of at most
    HEADLINE_COLUMNS columns (the full table stays in summary.csv)."""
    rows = df[df["subset"] == "all"] if "subset" in df.columns else df
    chosen = [m for m in HEADLINE_METRICS if (rows["metric"] == m[0]).any()][: HEADLINE_COLUMNS - 1]
    decoders = list(dict.fromkeys(rows["decoder"]))
    labels = _decoder_labels(rows, decoders)
    cells = [[labels[d]] for d in decoders]
    for metric, _, decimals, with_error in chosen:
        found = rows[rows["metric"] == metric].drop_duplicates("decoder").set_index("decoder")
        for row, decoder in zip(cells, decoders):
            row.append(_cell(found, decoder, decimals, with_error))
    table = _markdown(["decoder", *(m[1] for m in chosen)], cells, numeric_from=1)
    if any(labels[d] != str(d) for d in decoders):
        table += ("\ndecoder (setting): run at another setting than the paper's, e.g. the model's operating "
                  "point on its world (docs/configuration.md, \"Operating points\")")
    return table


def _decoder_labels(rows: pd.DataFrame, decoders: list[str]) -> dict[str, str]:
    """Each decoder's name, followed by its `setting` (harness/comparisons.decoder_setting) where it ran otherwise than in
    the paper: "lantern (k=32, δ=0.4, on_reject=pooled)"."""
    if SETTING_COLUMN not in rows.columns:
        return {d: str(d) for d in decoders}
    found = rows[rows[SETTING_COLUMN].notna() & (rows[SETTING_COLUMN].astype(str) != "")].drop_duplicates("decoder")
    settings = dict(zip(found["decoder"], found[SETTING_COLUMN].astype(str)))
    return {d: f"{d} ({settings[d]})" if d in settings else str(d) for d in decoders}


def _cell(found: pd.DataFrame, decoder: str, decimals: int, with_error: bool) -> str:
    """One headline cell: the value, and "± stderr" where asked for and known."""
    if decoder not in found.index or pd.isna(pd.to_numeric(found.at[decoder, "value"], errors="coerce")):
        return _MISSING
    value = float(found.at[decoder, "value"])
    error = pd.to_numeric(found.at[decoder, "stderr"], errors="coerce")
    text = f"{value:.{decimals}f}"
    if with_error and pd.notna(error) and error > 0:
        text += f" ± {float(error):.{decimals}f}"
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: print the Markdown table of the runs under the given directories."""
    parser = argparse.ArgumentParser(
        prog=("mulo-bench-results" if sys.argv[0].endswith("mulo-bench-results")
              else "python -m harness.results"),
        description="Print the summary.csv tables found under run directories as one table.",
    )
    parser.add_argument("dirs", nargs="+", type=Path, help="run directories (searched recursively)")
    parser.add_argument("--index", default="model,decoder", help="comma-separated row keys")
    parser.add_argument("--subset", default="all", help="which subset to show (default: all)")
    parser.add_argument("--all-subsets", action="store_true", help="one column per metric+subset")
    parser.add_argument("--partial", action="store_true",
                        help="read runs killed during evaluation too (their rows so far, labelled partial)")
    args = parser.parse_args(argv)
    try:
        frame = load(args.dirs, partial=args.partial)
        if args.all_subsets:
            table = format_table(frame, args.index.split(","), ("metric", "subset"), subset=None)
        else:
            table = format_table(frame, args.index.split(","), subset=args.subset)
    except (OSError, KeyError, ValueError) as exc:
        parser.error(exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc))
    sys.stdout.write((partial_label(args.dirs) if args.partial else "") + table + "\n")
    return 0


def _names(keys: str | Sequence[str]) -> list[str]:
    """Column names as a list (a single name may be given as a string)."""
    return [keys] if isinstance(keys, str) else list(keys)


def _first_seen(frame: pd.DataFrame, keys: list[str]) -> pd.Index:
    """The distinct values of `keys` in `frame`, in order of first appearance."""
    if len(keys) == 1:
        return pd.Index(frame[keys[0]].drop_duplicates(), name=keys[0])
    return pd.MultiIndex.from_frame(frame[keys].drop_duplicates())


def _directions(df: pd.DataFrame) -> dict[str, str]:
    """Arrow per metric: up when higher is better, down when lower is better."""
    if "higher_is_better" not in df.columns:
        return {}
    firsts = df.drop_duplicates("metric").set_index("metric")["higher_is_better"]
    return {str(m): ("↑" if _truthy(v) else "↓") for m, v in firsts.items() if pd.notna(v)}


def _truthy(value: object) -> bool:
    """Booleans as written to, and read back from, CSV."""
    return str(value).strip().lower() in {"true", "1", "1.0"}


def _as_tuple(key: object) -> tuple:
    return key if isinstance(key, tuple) else (key,)


def _label(key: object) -> str:
    """Column header of a pivoted key: "metric" or "metric/subset"."""
    return "/".join(str(k) for k in _as_tuple(key))


def _decimals(column: pd.Series) -> int:
    """Decimals for about four significant digits of the column's largest magnitude (0 to 4)."""
    finite = column[np.isfinite(column)].abs()
    if finite.empty or (finite == finite.round()).all():  # counts and exact ratios: no decimals
        return 0
    return int(min(4, max(0, 3 - math.floor(math.log10(finite.max())))))


def _markdown(headers: list[str], rows: list[list[str]], numeric_from: int) -> str:
    """A padded Markdown table; columns from `numeric_from` on are right-aligned."""
    widths = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        padded = [
            cell.rjust(width) if i >= numeric_from else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(cells, widths))
        ]
        return "| " + " | ".join(padded) + " |"

    rule = [
        "-" * (width + 1) + ":" if i >= numeric_from else "-" * (width + 2)
        for i, width in enumerate(widths)
    ]
    return "\n".join([line(headers), "|" + "|".join(rule) + "|", *(line(row) for row in rows)])



def paired_difference(a: pd.DataFrame, b: pd.DataFrame, key: str = "sample_id") -> tuple[float, float]:
    """GenEval overall of `a` minus that of `b`, scored on the same samples, and its standard error
    with the pairing kept (two decoders on one prompt set fail on many of the same prompts, so the
    paired error is smaller than the two scores' errors combined).

    a, b: per-image frames with `key`, `tag` and `correct` (GenEvalEvaluator's per_sample), one row
    per sample, the same samples and tags in both.
    Per tag t with n_t images, d = correct_a - correct_b in {-1, 0, 1}; the overall difference is
    the unweighted mean over the T tags of mean(d) (as the overall score is), and its variance is
    sum_t var(d) / n_t / T^2 (var with n_t - 1; a tag of one image contributes none).
    """
    for name, frame in (("a", a), ("b", b)):
        missing = [c for c in (key, "tag", "correct") if c not in frame.columns]
        if missing:
            raise ValueError(f"paired_difference: frame {name} lacks columns {missing}")
        if frame[key].duplicated().any():
            raise ValueError(f"paired_difference: frame {name} has repeated {key} values")
        if frame.empty:
            raise ValueError(f"paired_difference: frame {name} has no samples")
    joined = a[[key, "tag", "correct"]].merge(b[[key, "tag", "correct"]], on=key, how="outer",
                                              suffixes=("_a", "_b"), indicator=True)
    unmatched = joined[joined["_merge"] != "both"]
    if len(unmatched):
        raise ValueError(f"paired_difference needs the same samples in both frames; {len(unmatched)} "
                         f"are in one only (e.g. {unmatched[key].iloc[0]!r}): score both decoders "
                         "on one prompt set")
    if (joined["tag_a"] != joined["tag_b"]).any():
        raise ValueError("paired_difference: a sample has different tags in the two frames")
    d = joined["correct_a"].astype(float) - joined["correct_b"].astype(float)
    means, variances = [], []
    for _, diffs in d.groupby(joined["tag_a"], sort=False):
        means.append(float(diffs.mean()))
        variances.append(float(diffs.var(ddof=1)) / len(diffs) if len(diffs) > 1 else 0.0)
    return float(np.mean(means)), math.sqrt(sum(variances)) / len(means)


if __name__ == "__main__":
    raise SystemExit(main())
