"""Regenerate the paper's tables, figures and HTML reports from the results store.

    python -m harness.tables                                  # every run under results/
    python -m harness.tables results/main results/ablation_pooling --out results/paper
    python -m harness.tables --tables main,ablation_local --no-figures

writes, under --out (default results/paper):

    tables/<table>.md, .tex (booktabs), .csv    the paper's layout; ours beside the paper's numbers
    tables/<table>_sources.csv                  every shown value with its run directory / paper row
    tables/tables.md                            all tables in one file (also printed)
    <experiment>/index.html, <experiment>/figures/*.png|pdf    one static report per experiment
    index.html                                  links to every report and table

`python -m harness` writes one run's report with `run_report`: <run dir>/report/index.html shows the
run's own tables and figures (no index of links), the tables' files under report/tables/.

Tables: main, ablation_upsampling, ablation_pooling, ablation_local, ablation_parallel,
mulo_at_lantern_geneval (MuLo-SD at LANTERN's GenEval, from the matched_quality sweeps:
harness.report.matched), field_coco and field_parti (experiment field: the field's methods, their
published numbers as rows of their own beside the harness's; docs/field.md) (see
harness.report.specs), calibration (experiment calibration: each backbone's raster row beside its own
published number, within a stated tolerance or not; harness.report.calibration), and a generic table
for any other experiment in the store.
"""
from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import pandas as pd

from harness.store import summary
from harness.report import html as report
from harness.report import calibration
from harness.report.paper_reference import load_facts
from harness.report.build import Table, build_table
from harness.report.cells import with_derived_speedup
from harness.report.matched import with_matched_quality
from harness.report.render import FORMATS, to_html, to_markdown
from harness.report.specs import TABLES, spec_for, tables_help
from harness.store.samples import write_atomic

log = logging.getLogger(__name__)

DEFAULT_OUT = Path("results") / "paper"


@dataclass(slots=True)
class Regenerated:
    """What a regeneration wrote: built tables, table files, report pages and the Markdown."""

    tables: list[Table] = field(default_factory=list)
    table_files: list[Path] = field(default_factory=list)
    pages: list[Path] = field(default_factory=list)
    markdown: str = ""


def choose_tables(frame: pd.DataFrame, requested: Sequence[str] | None) -> list[str]:
    """Table names to build: `requested`, or the main table, every paper table whose experiment
    ran, and one generic table per other experiment in `frame`.

    Raises:
        ValueError: a requested name is neither a paper table nor an experiment in the results.
    """
    present = list(dict.fromkeys(frame["experiment"].dropna().astype(str))) if "experiment" in frame else []
    if requested:
        unknown = [n for n in requested if n not in TABLES and n not in present and n != calibration.TABLE]
        if unknown:
            raise ValueError(f"unknown tables {unknown}; paper tables: {tables_help()}; "
                             f"experiments in the results: {present}")
        return list(dict.fromkeys(requested))
    covered = {e for spec in TABLES.values() for e in spec.experiments} | {calibration.EXPERIMENT}
    paper = [n for n, spec in TABLES.items() if n == "main" or set(spec.experiments) & set(present)]
    own = [calibration.TABLE] if calibration.EXPERIMENT in present else []
    return paper + own + [e for e in present if e not in covered]


def regenerate(dirs: Sequence[Path | str], out: Path, requested: Sequence[str] | None = None,
               figures: bool = True, pages: bool = True, paper_rows: bool = True,
               grid_images: int = 6, partial: bool = False) -> Regenerated:
    """Build and write the tables (and figures and reports) of the runs under `dirs` into `out`.
    `partial`: read incomplete runs too, named as partial at the top of the Markdown tables."""
    frame = with_matched_quality(with_derived_speedup(summary.load(dirs, partial=partial)))
    facts = load_facts()
    done = Regenerated()
    markdown = []
    for name in choose_tables(frame, requested):
        if name == calibration.TABLE:  # its own layout: one line per (model, metric) with a verdict
            markdown.append(write_calibration(frame, out / "tables", done))
            continue
        table = build_table(frame, spec_for(name), facts, paper_rows=paper_rows)
        if table.is_empty() and not ((table.with_paper or table.spec.published_rows) and paper_rows):
            # a paper table shows the paper's rows, a field table the published ones
            log.log(logging.WARNING if requested else logging.INFO,
                    "table %s: no results from experiments %s; skipped", name, list(table.spec.experiments))
            continue
        done.tables.append(table)
        done.table_files += write_table(table, out / "tables")
        markdown.append(to_markdown(table))
    done.markdown = (summary.partial_label(dirs) if partial else "") + "\n".join(markdown)
    combined = out / "tables" / "tables.md"
    combined.parent.mkdir(parents=True, exist_ok=True)  # also when every table was skipped
    write_atomic(combined, done.markdown.encode("utf-8"))
    if pages:
        done.pages = write_reports(frame, facts, done, out, figures, grid_images)
        report.write_index(out / report.PAGE, [(p.parent.name, p) for p in done.pages], [combined, *done.table_files])
    return done


def write_table(table: Table, folder: Path) -> list[Path]:
    """Write `table` in every format (FORMATS) into `folder`; return the paths."""
    paths = []
    for suffix, render in FORMATS.values():
        path = folder / f"{table.spec.name}{suffix}"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, render(table).encode("utf-8"))
        paths.append(path)
    log.info("table %s: %d rows from %d runs -> %s", table.spec.name, len(table.rows), len(table.runs), folder)
    return paths


def write_calibration(frame: pd.DataFrame, folder: Path, done: Regenerated) -> str:
    """Write the calibration table (harness.report.calibration) as calibration.md and .csv into
    `folder`, add the files to `done`, and return its Markdown."""
    lines = calibration.build(frame, calibration.load_published())
    text = calibration.to_markdown(lines)
    folder.mkdir(parents=True, exist_ok=True)
    for suffix, body in ((".md", text), (".csv", calibration.to_csv(lines))):
        path = folder / f"{calibration.TABLE}{suffix}"
        write_atomic(path, body.encode("utf-8"))
        done.table_files.append(path)
    log.info("table %s: %d lines -> %s", calibration.TABLE, len(lines), folder)
    return text


def write_reports(frame: pd.DataFrame, facts: pd.DataFrame, done: Regenerated, out: Path,
                  figures: bool, grid_images: int) -> list[Path]:
    """One page per experiment of the built tables that has runs (the figures drawn on the way)."""
    present = set(frame["experiment"].dropna().astype(str))
    written = []
    for table in done.tables:
        if table.spec.experiments[0] not in present and not table.with_paper:
            continue
        sections = table_sections(frame, facts, table, done.table_files, out, figures, grid_images)
        page = out / table.spec.name / report.PAGE
        written.append(report.write_page(page, table.spec.title, sections, table.runs))
    return written


def table_sections(frame: pd.DataFrame, facts: pd.DataFrame, table: Table, table_files: Sequence[Path],
                   out: Path, figures: bool, grid_images: int) -> list[report.Section]:
    """The sections of `table` on a page: the table (with its legend and files), then the figures of
    its experiment (drawn into out/<table>/figures) when it ran."""
    from harness.report.paper_figures import experiment_figures  # matplotlib only when figures are wanted

    experiment = table.spec.experiments[0]
    files = [p for p in table_files if p.name.startswith(f"{table.spec.name}.")
             or p.name == f"{table.spec.name}_sources.csv"]
    sections = [report.Section(heading="Table", table_html=to_html(table), downloads=files)]
    if figures and experiment in set(frame["experiment"].dropna().astype(str)):
        drawn = experiment_figures(frame, facts, experiment, out / table.spec.name / "figures", grid_images)
        sections.append(report.Section(heading="Figures", figures=drawn))
    return sections


def run_report(run_dir: Path, out: Path, figures: bool = True, grid_images: int = 6) -> Path:
    """The report of one run, written under `out`: out/index.html shows the run's tables (each column
    defined in a legend) and figures itself; tables of experiments the run has no rows for are left
    out. The tables' files lie under out/tables. Return the page.

    Raises:
        FileNotFoundError: the run has no summary.csv (its evaluate stage did not run).
    """
    done = regenerate([run_dir], out, figures=False, pages=False, paper_rows=False)
    frame = with_matched_quality(with_derived_speedup(summary.load([run_dir])))
    facts = load_facts()
    sections = [section for table in done.tables
                for section in table_sections(frame, facts, table, done.table_files, out, figures, grid_images)]
    data = [path for path in (Path(run_dir) / summary.SUMMARY_NAME, Path(run_dir) / "run.json") if path.is_file()]
    if data:
        sections.append(report.Section(heading="Run files", downloads=data))
    experiments = ", ".join(dict.fromkeys(str(e) for e in frame["experiment"].dropna()))
    return report.write_page(out / report.PAGE, f"Run {experiments}: {Path(run_dir).name}", sections,
                             sorted({run for table in done.tables for run in table.runs}))


def main(argv: Sequence[str] | None = None) -> int:
    """Command line; prints every table as Markdown."""
    prog = "mulo-bench-tables" if sys.argv[0].endswith("mulo-bench-tables") else "python -m harness.tables"
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="paper tables: " + tables_help())
    parser.add_argument("dirs", nargs="*", type=Path, default=[Path("results")],
                        help="results directories, searched recursively for summary.csv (default: results)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default: {DEFAULT_OUT})")
    parser.add_argument("--tables", default="", help="comma-separated table or experiment names (default: all)")
    parser.add_argument("--no-figures", action="store_true", help="tables and reports without figures")
    parser.add_argument("--no-report", action="store_true", help="tables only (no HTML, no figures)")
    parser.add_argument("--results-only", action="store_true",
                        help="leave out the paper's rows that the results do not cover")
    parser.add_argument("--grid-images", type=int, default=6, help="prompts per image grid (default: 6)")
    parser.add_argument("--partial", action="store_true",
                        help="read runs killed during evaluation too (their rows so far, labelled partial)")
    args = parser.parse_args(argv)
    if args.grid_images < 1:
        parser.error(f"--grid-images must be a whole number >= 1 (prompts per image grid), got {args.grid_images}")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    requested = [n.strip() for n in args.tables.split(",") if n.strip()] or None
    try:
        done = regenerate(args.dirs, args.out, requested, figures=not args.no_figures, pages=not args.no_report,
                          paper_rows=not args.results_only, grid_images=args.grid_images, partial=args.partial)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    sys.stdout.write(done.markdown)
    log.info("wrote %d tables%s under %s", len(done.tables),
             f" and {len(done.pages)} reports" if done.pages else "", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
