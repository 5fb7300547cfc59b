"""Reporting: from the results store (summary.csv files) to the paper's tables beside its numbers,
figures and static HTML reports.

    specs.py            what each paper table holds (rows, columns, the runs they come from)
    cells.py            merged summary rows -> one value per table cell
    build.py            a spec + cells -> a table (ours beside the paper's numbers)
    matched.py          the matched-quality row: the swept τ whose GenEval is closest to LANTERN's
    render.py           tables as Markdown, LaTeX (booktabs) and CSV
    paper_reference.py  the paper's published numbers (harness/data/paper_numbers.csv)
    figures.py          per-experiment figures (speed/quality, rejection heat maps, samples)
    paper_figures.py    the paper's figures from the store
    html.py             static HTML reports and their index
    tables.py           `python -m harness.tables` / `mulo-bench-tables`: all of the above
"""
