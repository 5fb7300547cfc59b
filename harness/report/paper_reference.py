"""Published numbers as fact tables: the MuLo-SD paper's (harness/data/paper_numbers.csv) and the
field's, the numbers other methods' papers and repositories publish (harness/data/field_numbers.csv);
see SOURCE.md there.

One row per (table, model, decoder, metric) with the publication's row labels and the source of the
value, so every number printed beside a regenerated one can be traced to where it was read.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pandas as pd

PAPER_NUMBERS = Path(__file__).resolve().parents[1] / "data" / "paper_numbers.csv"
FIELD_NUMBERS = PAPER_NUMBERS.with_name("field_numbers.csv")
FACT_COLUMNS = ("table", "base", "method", "model", "decoder", "metric", "value", "unit", "source")
FACT_KEY = ("table", "model", "decoder", "metric")


def load_paper_numbers(path: Path | str = PAPER_NUMBERS) -> pd.DataFrame:
    """Return the fact table (FACT_COLUMNS, `value` as float), validated.

    Raises:
        FileNotFoundError: the file is missing.
        ValueError: a column is missing, a value is not a number, a row has no source, or two rows
            give the same (table, model, decoder, metric).
    """
    return _load(str(Path(path).resolve())).copy()


def load_facts() -> pd.DataFrame:
    """Every published number the tables show: the paper's facts, then the field's (FACT_COLUMNS).

    Raises:
        ValueError: as load_paper_numbers, or both files give the same fact.
    """
    facts = pd.concat([load_paper_numbers(PAPER_NUMBERS), load_paper_numbers(FIELD_NUMBERS)], ignore_index=True)
    duplicated = facts[facts.duplicated(list(FACT_KEY), keep=False)]
    if not duplicated.empty:
        raise ValueError(f"{PAPER_NUMBERS.name} and {FIELD_NUMBERS.name} both give the fact "
                         f"{duplicated.iloc[0][list(FACT_KEY)].to_dict()}")
    return facts


@lru_cache(maxsize=4)
def _load(path: str) -> pd.DataFrame:
    """Read and validate once per path (callers receive copies)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"the paper reference table {path} is missing; it ships in harness/data/")
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    missing = [c for c in FACT_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"{path} lacks the columns {missing}; expected {list(FACT_COLUMNS)}")
    values = pd.to_numeric(frame["value"], errors="coerce")
    if values.isna().any():
        bad = frame.loc[values.isna(), list(FACT_KEY)].iloc[0].to_dict()
        raise ValueError(f"{path}: a value is not a number, e.g. the row {bad}")
    if (frame["source"].str.strip() == "").any():
        bad = frame.loc[frame["source"].str.strip() == "", list(FACT_KEY)].iloc[0].to_dict()
        raise ValueError(f"{path}: every value needs a source; the row {bad} has none")
    duplicated = frame[frame.duplicated(list(FACT_KEY), keep=False)]
    if not duplicated.empty:
        raise ValueError(f"{path}: two rows give the same fact {duplicated.iloc[0][list(FACT_KEY)].to_dict()}")
    return frame.assign(value=values.astype(float))[list(FACT_COLUMNS)]


def paper_labels(facts: pd.DataFrame, table: str) -> tuple[dict[str, str], dict[tuple[str, str], str]]:
    """The paper's labels in `table`: model -> base label, and (model, decoder) -> method label."""
    rows = facts[facts["table"] == table]
    bases = dict(zip(rows["model"], rows["base"]))
    methods = {(m, d): label for m, d, label in zip(rows["model"], rows["decoder"], rows["method"])}
    return bases, methods


__all__ = ["FACT_COLUMNS", "FACT_KEY", "FIELD_NUMBERS", "PAPER_NUMBERS", "load_facts", "load_paper_numbers",
           "paper_labels"]
