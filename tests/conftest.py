"""Shared fixtures: Hydra composition of the project's configs, small random bundles."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
SHARED_DATA = ROOT.parent / "shared" / "data"

torch.set_num_threads(1)  # robust on shared, oversubscribed CI machines


def compose_cfg(overrides: list[str] | None = None) -> DictConfig:
    """The primary config composed with `overrides` (no Hydra run, no output folder)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides or [], return_hydra_config=False)


@pytest.fixture
def shared_data() -> Path:
    """The benchmark data files beside the checkout (skips when absent, e.g. in a user's clone)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"benchmark data folder {SHARED_DATA} is absent (only present in the development setup)")
    return SHARED_DATA
