"""Progress of long loops in a batch job's log (no terminal): lines at most once per interval and
one at the end, with counts, share and time left; nothing for an empty loop."""
from __future__ import annotations

import logging

import pytest

from harness import progress as progress_module
from harness.progress import line, progress


def test_a_log_line_per_interval_and_at_the_end(caplog: pytest.LogCaptureFixture,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([0.0, 10.0, 70.0, 80.0, 200.0])  # start, then after each of four items
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: next(clock))
    with caplog.at_level(logging.INFO, logger="harness.progress"):
        seen = list(progress(["a", "b", "c", "d"], "untimed raster", "batches", interval=60.0,
                             interactive=False))
    assert seen == ["a", "b", "c", "d"]
    lines = [r.getMessage() for r in caplog.records]
    # item 1 at 10 s: too soon; item 2 at 70 s: a line; item 3 at 80 s: too soon; item 4: the end
    assert lines == [line("untimed raster", "batches", 2, 4, 70.0),
                     line("untimed raster", "batches", 4, 4, 200.0)]
    assert "2/4 batches (50%)" in lines[0] and "1.2 min elapsed" in lines[0]
    assert "about 1.2 min left" in lines[0]
    assert lines[1].endswith("about 0.0 min left")


def test_no_line_for_an_empty_loop_and_counts_without_a_total(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="harness.progress"):
        assert list(progress([], "untimed raster", "batches", interactive=False)) == []
        assert list(progress(iter([1, 2]), "decodes", "decodes", interval=0.0, interactive=False)) == [1, 2]
        assert list(progress([3], "off", "items", interval=0.0, interactive=False, enabled=False)) == [3]
    counts = [r.getMessage().split(",")[0] for r in caplog.records]
    assert counts == ["decodes: 1 decodes", "decodes: 2 decodes"]
