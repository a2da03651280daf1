"""Turning composed Hydra configs into objects, with one readable error per mistake."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from dlmsearch.shipped import package_data

# Inside the package, so a wheel carries every config (found through importlib.resources).
CONF_DIR = Path(str(resources.files("dlmsearch") / "conf"))

# ${package_data:NAME} in a config: a directory shipped inside the package, as a string.
OmegaConf.register_new_resolver("package_data", lambda name: str(package_data(name)), replace=True)


def _checkpoint_id(key: str, _parent_: DictConfig) -> Any:
    """``${checkpoint:KEY}`` (conf/model/llada.yaml, dream.yaml): the id the model directory names, else its ``fallback_ids.KEY``."""
    from dlmsearch.models.loading import preset_id  # imported only when a text preset resolves its ids

    return preset_id(key, _parent_)


OmegaConf.register_new_resolver("checkpoint", _checkpoint_id, replace=True)


class ConfigError(ValueError):
    """A config value that cannot be used; the message names the key."""


def decoder_presets() -> list[str]:
    """Names of the files in ``conf/decoder/``."""
    return sorted(p.stem for p in (CONF_DIR / "decoder").glob("*.yaml"))


def build(cfg: DictConfig, key: str, **kwargs: Any) -> Any:
    """Instantiate ``cfg[key]`` (recursively); errors name the config key that caused them."""
    if key not in cfg or cfg[key] is None:
        raise ConfigError(f"config has no '{key}' section")
    try:
        # Objects are passed after instantiation: OmegaConf would turn attrs instances into configs.
        return hydra.utils.instantiate(cfg[key], _partial_=True)(**kwargs) if kwargs else hydra.utils.instantiate(cfg[key])
    except Exception as error:  # Hydra wraps the real cause; unwrap it into one line
        cause = error.__cause__ or error
        detail = str(error).split("full_key:")[-1].strip().splitlines()[0] if "full_key:" in str(error) else key
        if isinstance(cause, MissingMandatoryValue):
            raise ConfigError(f"{detail} is required (the config leaves it as ???): add {detail}=...") from error
        message = str(cause).split("\n    full_key:")[0].strip()
        raise ConfigError(f"{detail}: {type(cause).__name__}: {message}") from error


def to_plain(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as plain data (for summary.json)."""
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def compose(overrides: list[str], config_name: str = "config") -> DictConfig:
    """Compose ``conf/<config_name>.yaml`` (the CLI's ``config``, the server's ``serve``) with overrides outside a Hydra app (scripts, tests)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    # Inside another Hydra app (the training script) the global instance is taken: set it
    # aside and put it back. Hydra swaps the singleton on exit, so look it up again after.
    outer = GlobalHydra.instance().hydra if GlobalHydra.instance().is_initialized() else None
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            return hydra_compose(config_name, overrides=["out_dir=.", *overrides])
    finally:
        GlobalHydra.instance().clear()
        if outer is not None:
            GlobalHydra.instance().initialize(outer)
