"""`python -m harness [+experiment=NAME] [overrides]`: run one Hydra job (or a sweep with -m)."""
from __future__ import annotations

import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from harness.run import run


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    logging.getLogger("harness").setLevel(logging.INFO)
    run(cfg, Path(HydraConfig.get().runtime.output_dir))


if __name__ == "__main__":
    main()
