"""python -m harness.tables: the field's tables (experiment field) from a fabricated results store,
each method's published numbers as rows of their own, every one with its source, beside the harness's."""
from __future__ import annotations

import csv
from pathlib import Path

import pandas as pd
import pytest

from harness.report.paper_reference import FIELD_NUMBERS, load_facts, load_paper_numbers
from harness.report.specs import FIELD_COCO, FIELD_PARTI
from harness.report.tables import main, regenerate
from tests.fabricated_store import build_field_store, build_store

COCO_ROWS = """\
| Lumina-mGPT (published) | AR           |  1.00× |     1.00× | 30.79 |  31.31 |         — |
|                         | SJD          |  2.22× |     2.05× | 31.13 |  31.33 |         — |
|                         | SJD-PAC      |  4.51× |     3.80× | 30.69 |  31.21 |         — |
|                         | GSD          |  3.39× |     3.62× | 33.12 |  31.25 |         — |
|                         | LANTERN++    |  3.19× |     2.28× | 29.96 |  30.11 |         — |
|                         | EAGLE        |  2.94× |     2.10× | 30.68 |  31.73 |         — |
|                         | SJD²         |  4.02× |     2.81× | 31.40 |  31.80 |         — |
| Emu3 (published)        | AR           |  1.00× |     1.00× | 31.12 |  31.05 |         — |
|                         | SJD          |  2.32× |     2.01× | 30.74 |  30.95 |         — |
|                         | SJD-PAC      |  4.31× |     3.25× | 31.10 |  30.99 |         — |
|                         | SJD²         |  5.62× |     2.54× | 31.50 |  30.40 |         — |
| LlamaGen-XL (512p)      | Raster AR    |  1.00× |     1.00× | 30.50 |  31.20 |      36.0 |
|                         | SJD          |  2.20× |     2.00× | 30.90 |  31.10 |         — |
|                         | SJD-PAC      |  4.50× |     4.00× | 30.70 |  31.30 |         — |
|                         | MuLo-SD (2×) |  3.00× |     2.50× | 31.80 |  30.90 |      35.0 |
"""

PARTI_HARNESS_ROWS = """\
| LlamaGen-XL (512p)      | Raster AR    |  1.00× |     1.00× |     — |  32.00 |      36.0 |
|                         | SJD-PAC      |  4.60× |     5.00× |     — |  32.10 |         — |
|                         | MuLo-SD (2×) |      — |         — |     — |      — |      35.0 |
"""


@pytest.fixture
def regenerated(tmp_path: Path):
    return regenerate([build_field_store(tmp_path)], tmp_path / "out", figures=False, pages=True), tmp_path / "out"


def test_field_tables_lay_published_rows_beside_the_harness_rows(regenerated) -> None:
    done, out = regenerated
    names = [t.spec.name for t in done.tables]
    assert {"field_coco", "field_parti"} <= set(names) and "field" not in names  # no generic table besides
    coco = (out / "tables" / "field_coco.md").read_text()
    assert "| Model                   | Method       | Step ↑ | Latency ↑ | FID ↓ | CLIP ↑ | GenEval ↑ |" in coco
    assert COCO_ROWS in coco
    parti = (out / "tables" / "field_parti.md").read_text()
    assert PARTI_HARNESS_ROWS in parti  # the geneval run's batched speed stays out of the speed columns
    assert "| Lumina-mGPT (published) | AR           |  1.00× |     1.00× |     — |  32.01 |         — |" in parti
    assert (out / "field_coco" / "index.html").is_file()


def test_every_published_value_shown_carries_its_source(regenerated) -> None:
    _, out = regenerated
    for name in ("field_coco", "field_parti"):
        sources = pd.read_csv(out / "tables" / f"{name}_sources.csv")
        shown = sources[sources["published"] & sources["paper"].notna()]
        assert len(shown) > 20
        assert shown["paper_source"].str.contains("KangJialiang/SJD-PAC@4fbc099f7f76").all()
        assert sources.loc[~sources["published"], "paper"].isna().all()  # nothing published beside harness rows
        harness = sources[~sources["published"] & sources["ours"].notna()]
        assert harness["run_dir"].notna().all()
    html = (out / "field_coco" / "index.html").read_text()
    assert 'title="github.com/KangJialiang/SJD-PAC@' in html


def test_the_field_numbers_file_is_valid_and_sourced() -> None:
    facts = load_paper_numbers(FIELD_NUMBERS)
    assert set(facts["table"]) == {FIELD_COCO.name, FIELD_PARTI.name}
    assert (facts["source"].str.strip() != "").all()
    with open(FIELD_NUMBERS, encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            assert row["source"].startswith("github.com/") and "@" in row["source"] and "README.md" in row["source"]
    pac = facts[(facts["model"] == "lumina_mgpt") & (facts["decoder"] == "sjd_pac") & (facts["table"] == "field_parti")]
    assert dict(zip(pac["metric"], pac["value"])) == {"step_compression": 4.62, "speedup": 3.97, "clip_score": 32.07}
    assert facts[(facts["table"] == "field_parti") & (facts["metric"] == "fid")].empty  # not defined on PartiPrompts
    both = load_facts()
    assert len(both) == len(facts) + len(load_paper_numbers())


def test_a_field_table_without_results_shows_the_published_rows_when_asked(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture) -> None:
    other = build_store(tmp_path)  # experiments main and the ablations, no field run
    assert main([str(other), "--out", str(tmp_path / "out"), "--tables", "field_parti", "--no-report"]) == 0
    text = capsys.readouterr().out
    assert "| Emu3 (published)        | AR" in text and "LlamaGen" not in text
    assert main([str(other), "--out", str(tmp_path / "out2"), "--tables", "field_parti", "--no-report",
                 "--results-only"]) == 0
    assert "Emu3" not in capsys.readouterr().out
    assert main([str(other), "--out", str(tmp_path / "out3"), "--no-report"]) == 0
    assert "field beside MuLo-SD" not in capsys.readouterr().out  # only asked for, without a field run
