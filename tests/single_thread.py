"""An autouse fixture for test modules that decode with tiny models: one intra-op thread.

Tiny models gain nothing from threads, and on a shared, loaded CPU two threads wait on each other
(decoding measured 20x slower). Import `single_thread` into a test module to use it; the session's
setting is restored afterwards."""
from __future__ import annotations

from typing import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def single_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
