"""An experiment's `published_protocols` (model -> the protocols its published numbers were measured
under; experiment calibration): a job of a listed model under another protocol is refused before
anything is loaded, since its rows would be compared with numbers measured otherwise."""
from __future__ import annotations

from omegaconf import DictConfig

from harness.api import ConfigValueError


def check_published_protocol(cfg: DictConfig) -> None:
    """Raise ConfigValueError when `cfg.model.name` is listed in `cfg.published_protocols` and
    `cfg.protocol_name` is not one of its protocols; nothing for unlisted models or experiments
    without the key."""
    table = cfg.get("published_protocols")
    model = str(cfg.model.get("name", ""))
    if not table or model not in table:
        return
    allowed = [str(p) for p in table[model]]
    protocol = str(cfg.get("protocol_name") or "")
    if protocol not in allowed:
        raise ConfigValueError(
            f"experiment {cfg.get('name')}: model {model}'s published numbers were measured under "
            f"protocol {' or '.join(allowed)}, not {protocol or 'none'}; pass protocol={allowed[0]}")


__all__ = ["check_published_protocol"]
