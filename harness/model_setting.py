"""A model's setting where it runs otherwise than its published protocol: the precision keys a model
config declares in `paper_precision` (e.g. Tar: AR-DTok and TA-Tok in fp32, the LLM in bf16, as its
evaluation scripts) compared with the values the job uses. A row made at another precision carries
the difference in its `setting` column (and so in its method label), e.g. "dtype=bf16"."""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf


def model_setting(cfg: DictConfig) -> str | None:
    """"key=value" of every `model.paper_precision` key whose value in `model` differs, joined by ", ";
    None where all match or the model declares no published precision."""
    model = cfg.get("model")
    paper = model.get("paper_precision") if model is not None else None
    if not paper:
        return None
    changed = []
    for key, value in OmegaConf.to_container(paper, resolve=True).items():
        now = OmegaConf.select(model, str(key))
        if str(now) != str(value):
            changed.append(f"{key}={now}")
    return ", ".join(changed) or None


def joined(*settings: str | None) -> str | None:
    """The non-empty settings joined by ", " (None if none)."""
    parts = [s for s in settings if s]
    return ", ".join(parts) or None


__all__ = ["joined", "model_setting"]
