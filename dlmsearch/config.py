"""Turning composed Hydra configs into objects, with one readable error per mistake."""

from __future__ import annotations

import difflib
import inspect
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

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


def _diffusion_gemma(key: str, _parent_: DictConfig) -> Any:
    """``${diffusion_gemma:KEY}`` (conf/model/diffusion_gemma.yaml): what the checkpoint directory at
    ``model.path`` declares (vocab_size, mask_id, canvas_length, stop_ids)."""
    from dlmsearch.models.diffusion_gemma import checkpoint_fields

    path = None if OmegaConf.is_missing(_parent_, "path") else _parent_.get("path")
    return checkpoint_fields(path)[key]


OmegaConf.register_new_resolver("diffusion_gemma", _diffusion_gemma, replace=True)


def _generation_config(field: str, *, _root_: DictConfig) -> Any:
    """``${generation_config:FIELD}`` (conf/decoder/commit/uniform_noise.yaml): UniformNoiseSteps'
    ``FIELD`` as the checkpoint at ``model.path`` names it in its generation_config.json, else
    transformers' default (:data:`dlmsearch.models.diffusion_gemma.STEP_SETTINGS`, the one table)."""
    from dlmsearch.models.diffusion_gemma import checkpoint_step_settings

    return checkpoint_step_settings(OmegaConf.select(_root_, "model.path", default=None))[field]


OmegaConf.register_new_resolver("generation_config", _generation_config, replace=True)


def _trained_on(key: str, default: Any, *, _root_: DictConfig) -> Any:
    """``${trained_on:KEY,DEFAULT}`` (conf/task/*.yaml): what ``model.path``'s directory declares it
    was trained to do (its trained_on.json), else ``DEFAULT``."""
    from dlmsearch.models.trained_on import read_trained_on

    return read_trained_on(OmegaConf.select(_root_, "model.path", default=None)).get(key, default)


OmegaConf.register_new_resolver("trained_on", _trained_on, replace=True)


class ConfigError(ValueError):
    """A config value that cannot be used; the message names the key."""


def decoder_presets(noise: str | None = None) -> list[str]:
    """Names of the files in ``conf/decoder/``; ``noise``: only those that decode masked (``mask``) or
    uniform-noise (``uniform``) models. A search is the same on both: on a uniform-noise model the
    model's own step replaces a rule that fills masks (``search.plan.with_model_parts``). A preset
    built on ``commit: uniform_noise`` runs on uniform noise only; one that revises commits, sets
    its own temperature (the uniform step's schedule decides it), searches a tree of commits, or changes its
    length (DAEDAL, rho-EOS), on masked models only."""
    names = group_options("decoder")
    if noise is None:
        return names
    if noise not in ("mask", "uniform"):
        raise ValueError(f"noise must be mask or uniform, got {noise!r}")
    return [name for name in names if noise in _preset_noise(name)]


def preset_summary(name: str, width: int = 76) -> str:
    """The first comment line of decoder preset ``name``'s file (what it is), cut to ``width``."""
    lines = (CONF_DIR / "decoder" / f"{name}.yaml").read_text().splitlines()
    text = lines[0].lstrip("# ").strip() if lines and lines[0].startswith("#") else ""
    continued = len(lines) > 1 and lines[1].startswith("#")
    if len(text) <= width and not continued:
        return text
    return text[: width - 3].rsplit(" ", 1)[0].rstrip(",;:") + "..."


def _preset_noise(name: str) -> tuple[str, ...]:
    """The models decoder preset ``name`` decodes: ``mask``, ``uniform``, or both (read from its file
    and the ``generation`` group file it names)."""
    text = (CONF_DIR / "decoder" / f"{name}.yaml").read_text()
    if "commit: uniform_noise" in text:
        return ("uniform",)
    generation = re.search(r"generation@_here_: (\w+)", text)
    layered = text + ((CONF_DIR / "decoder" / "generation" / f"{generation[1]}.yaml").read_text() if generation else "")
    own_temperature = re.search(r"^\s*temperature: (?!null)", layered, re.MULTILINE)
    tree = re.search(r"^\s*(- )?tree:", text, re.MULTILINE)  # a tree search commits masked positions
    length = re.search(r"^\s*- length: (?!fixed)", text, re.MULTILINE)  # a canvas that grows: masked models only
    return ("mask",) if "revision:" in text or own_temperature or tree or length else ("mask", "uniform")


def build(cfg: DictConfig, key: str, **kwargs: Any) -> Any:
    """Instantiate ``cfg[key]`` (recursively); errors name the config key that caused them."""
    if key not in cfg or cfg[key] is None:
        raise ConfigError(f"config has no '{key}' section")
    try:
        # Objects are passed after instantiation: OmegaConf would turn attrs instances into configs.
        return (
            hydra.utils.instantiate(cfg[key], _partial_=True)(**kwargs) if kwargs else hydra.utils.instantiate(cfg[key])
        )
    except Exception as error:  # Hydra wraps the real cause; unwrap it into one line
        raise _build_error(cfg, key, error) from error


def _build_error(cfg: DictConfig, key: str, error: Exception) -> ConfigError:
    """One line for a failed build that names the full key: a key the target does not take (as
    :func:`unread_key`), a value a validator refused (``decoder.expansion.max_depth must be an
    integer, got 'abc'``), or the cause as raised."""
    problem = unread_key(cfg[key], key)
    if problem is not None:
        return ConfigError(problem)
    cause = error.__cause__ or error
    detail = str(error).split("full_key:")[-1].strip().splitlines()[0] if "full_key:" in str(error) else key
    if isinstance(cause, MissingMandatoryValue):
        return ConfigError(f"{detail} is required (the config leaves it as ???): add {detail}=...")
    message = str(cause).split("\n    full_key:")[0].strip()
    section = OmegaConf.select(cfg, detail, default=None) if detail else None
    name = message.split(" ", 1)[0]
    if isinstance(section, DictConfig) and isinstance(cause, (TypeError, ValueError)) and name in section:
        return ConfigError(f"{detail}.{message}")  # an attrs validator's message starts with the field's name
    return ConfigError(f"{detail}: {type(cause).__name__}: {message}")


def to_plain(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as plain data (for summary.json)."""
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def compose(overrides: list[str], config_name: str = "config") -> DictConfig:
    """Compose ``conf/<config_name>.yaml`` (the CLI's ``config``, the server's ``serve``) with overrides outside a Hydra app (scripts, tests)."""
    return _compose(overrides, config_name)[0]


def _compose(overrides: Sequence[str], config_name: str = "config") -> tuple[DictConfig, set[str]]:
    """The composed config and the config groups its defaults chose (``decoder``, ``decoder/commit``, ...)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    # Inside another Hydra app (the training script) the global instance is taken: set it
    # aside and put it back. Hydra swaps the singleton on exit, so look it up again after.
    outer = GlobalHydra.instance().hydra if GlobalHydra.instance().is_initialized() else None
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            cfg = hydra_compose(config_name, overrides=["out_dir=.", *overrides], return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()
        if outer is not None:
            GlobalHydra.instance().initialize(outer)
    groups = {str(g).split("@")[0] for g in cfg.hydra.runtime.choices}  # "decoder/generation@decoder": the group
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, groups


# ----------------------------------------------------------------------- closest names


def closest(name: str, options: Iterable[str]) -> list[str]:
    """The options that look like a misspelling of ``name``: difflib's best match (ratio at least
    0.6) and those nearly as close (within 0.1 of it)."""
    options = sorted(set(options))
    scored = [
        (difflib.SequenceMatcher(None, name, option).ratio(), option)
        for option in difflib.get_close_matches(name, options, n=3, cutoff=0.6)
    ]
    return [option for ratio, option in scored if ratio >= scored[0][0] - 0.1] if scored else []


def suggest(name: str, options: Iterable[str]) -> str:
    """``'; did you mean X?'`` for a near miss, else ``'; one of: a, b, ...'`` (empty without options)."""
    options = sorted(set(options))
    near = closest(name, options)
    if near:
        return f"; did you mean {' or '.join(near)}?"
    return f"; one of: {', '.join(options)}" if options else ""


def unknown(what: str, name: str, options: Iterable[str]) -> str:
    """One line for a name that is none of ``options``: ``unknown model 'lada'; did you mean llada?``."""
    return f"unknown {what} {name!r}{suggest(name, options)}"


def group_options(group: str) -> list[str]:
    """The files of a config group (``decoder``, ``decoder/expansion``) without ``.yaml``."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def config_groups() -> list[str]:
    """Every config group of ``conf/`` (``cache``, ``decoder/population/choice``, ...)."""
    return sorted({str(p.parent.relative_to(CONF_DIR)) for p in CONF_DIR.rglob("*.yaml") if p.parent != CONF_DIR})


# ------------------------------------------------------------- every key is read by someone

_HYDRA_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}


def accepted_keys(section: DictConfig) -> set[str] | None:
    """The keys a ``_target_`` section may hold: its target's parameters (None: it takes any, or
    the target cannot be looked up, so nothing is refused here; instantiation still checks)."""
    target = section.get("_target_") if isinstance(section, DictConfig) else None
    if not isinstance(target, str):
        return None
    try:
        parameters = inspect.signature(hydra.utils.get_object(target)).parameters.values()
    except Exception:  # noqa: BLE001  (a target that does not import fails at build, with its own line)
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return {p.name for p in parameters if p.kind is not inspect.Parameter.VAR_POSITIONAL} | _HYDRA_KEYS


def key_problem(cfg: DictConfig, key: str) -> str | None:
    """Why ``key`` (dotted) would be read by nobody in ``cfg``, in one line, or None when it is read:
    it is in the config, or it is a parameter of the ``_target_`` of the section that would hold it."""
    parts = key.split(".")
    node: Any = cfg
    for depth, part in enumerate(parts):
        where = ".".join(parts[:depth])
        try:
            present = isinstance(node, DictConfig) and part in node
            child = node[part] if present else None
        except OmegaConfBaseException:  # an interpolation that resolves only in a run: cannot check here
            return None
        if present:
            node = child
            continue
        if not isinstance(node, DictConfig):
            return f"{where} is a value ({node!r}), not a section: {key} cannot be set"
        accepted = accepted_keys(node)
        if depth > 0 and accepted is None and "_target_" in node:
            return None  # a target taking any keyword
        if accepted is not None and part in accepted:
            group = "/".join([*parts[:depth], part])
            if (
                depth + 1 < len(parts) and (CONF_DIR / group).is_dir()
            ):  # a slot this preset leaves empty: a file fills it
                return f"{key!r}: {where}.{part} is not in this config; choose one first with +{group}=NAME (one of: {', '.join(group_options(group))})"
            return None  # a parameter its yaml leaves at the default
        if depth == 0 and "/" in part:
            return unknown("config group", part, config_groups())
        return _unknown_key(key, where, part, {str(k) for k in node} | (accepted or set()))
    return None


def _unknown_key(key: str, where: str, part: str, known: Iterable[str]) -> str:
    """``unknown key 'a.b.c'; did you mean a.b.d?`` for the part of ``key`` (dotted) that section
    ``where`` neither holds nor takes; without a near miss, what the section has."""
    known = set(known) - _HYDRA_KEYS
    prefix = f"{where}." if where else ""
    rest = key[len(prefix) + len(part) :]
    near = closest(part, known)
    if near:
        return f"unknown key {key!r}; did you mean {' or '.join(prefix + n + rest for n in near)}?"
    return f"unknown key {key!r}; {where or 'the config'} has: {', '.join(sorted(known))}"


def unread_key(cfg: DictConfig, where: str = "") -> str | None:
    """The first key of a ``_target_`` section of ``cfg`` (at dotted ``where``) that its target does
    not take, as :func:`key_problem`'s line, or None: a typo inside a YAML file (the user's own, a
    preset) is named as on the command line, before anything is built or loaded."""
    for path, section in _target_sections(cfg, where):
        accepted = accepted_keys(section)
        for name in section if accepted is not None else ():
            if str(name) not in accepted:
                return _unknown_key(f"{path}.{name}" if path else str(name), path, str(name), accepted)
    return None


def check_keys(cfg: DictConfig, where: str = "") -> None:
    """Raise :func:`unread_key`'s line as a :class:`ConfigError`."""
    problem = unread_key(cfg, where)
    if problem is not None:
        raise ConfigError(problem)


_REFERENCE = re.compile(r"\$\{[^:}]*(\$\{[^:}]*\}[^:}]*)*\}")  # ${a.b}, ${a.${b}}: no resolver (nothing read or loaded)


def _target_sections(node: Any, path: str) -> Iterator[tuple[str, DictConfig]]:
    """Every section under ``node`` that names a ``_target_``, with its dotted path. A child that is
    an interpolation is followed only where it refers to another node (``${ablate.arms.${ablate.arm}}``);
    one that cannot resolve here is left to the build."""
    if isinstance(node, DictConfig) and "_target_" in node:
        yield path, node
    if not isinstance(node, (DictConfig, ListConfig)):
        return
    keys = node.keys() if isinstance(node, DictConfig) else range(len(node))
    for key in keys:
        if OmegaConf.is_interpolation(node, key) and not _REFERENCE.fullmatch(str(node._get_node(key)._value())):
            continue
        try:
            child = node[key]
        except OmegaConfBaseException:
            continue
        yield from _target_sections(child, f"{path}.{key}" if path else str(key))


# ------------------------------------------------------------------- overrides and their mistakes


def _parse(overrides: Sequence[str]) -> list[Any]:
    """Hydra's own reading of override strings (a mistake: one ConfigError line)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        return OverridesParser.create().parse_overrides(list(overrides))
    except OverrideParseException as error:
        raise ConfigError(f"cannot read the override {error.override!r}: {error.message.splitlines()[0]}") from error


def check_added_keys(overrides: Sequence[str], groups: set[str], config_name: str = "config") -> None:
    """Every ``+key=`` / ``++key=`` of ``overrides`` must be read by someone (``key_problem``),
    judged against the config composed without them; ``+group=option`` (a group in ``groups``,
    those the composition chose) is Hydra's to check."""
    added = [
        o
        for o in _parse(overrides)
        if (o.is_add() or o.is_force_add()) and not o.is_hydra_override() and o.key_or_group not in groups
    ]
    if not added:
        return
    lines = {o.input_line for o in added}
    base = _compose([o for o in overrides if o not in lines], config_name)[0]
    for override in added:
        problem = key_problem(base, override.key_or_group)
        if problem is not None:
            raise ConfigError(problem)


def explain(error: Exception, overrides: Sequence[str], config_name: str = "config") -> ConfigError:
    """Hydra's composition error as one line naming the key or option and the closest valid names."""
    from hydra.errors import MissingConfigException, OverrideParseException

    if isinstance(error, MissingConfigException) and error.missing_cfg_file:
        group, _, option = error.missing_cfg_file.rpartition("/")
        return ConfigError(unknown(group or "config", option, error.options or ()))
    if isinstance(error, OverrideParseException):
        return ConfigError(f"cannot read the override {error.override!r}: {error.message.splitlines()[0]}")
    text = str(error).strip()
    first = text.splitlines()[0].rstrip(".") if text else type(error).__name__
    overridden = re.match(r"Could not override '([^']+)'", text)
    if overridden and "No match in the defaults list" not in text:
        return ConfigError(_unknown_override(overridden.group(1), overrides, config_name) or first)
    appended = re.match(r"Could not append to config\. An item is already at '([^']+)'", text)
    if appended:
        key, plain = appended.group(1), re.search(r"remove \+ prefix: '(.+)'", text)
        group = (
            f" (or {key.replace('.', '/')}=NAME to choose a file of conf/{key.replace('.', '/')}/)"
            if (CONF_DIR / key.replace(".", "/")).is_dir()
            else ""
        )
        return ConfigError(
            f"{key} is in the config already: set it without +, {plain.group(1) if plain else key + '=...'}{group}"
        )
    deleted = re.match(r"Could not delete from config\. '([^']+)' does not exist", text)
    if deleted:
        return ConfigError(_unknown_override(deleted.group(1), overrides, config_name) or first)
    if "No match in the defaults list" in text and overridden:
        hint = re.search(r"use (\+\S+)", text)
        return ConfigError(
            f"{overridden.group(1)} has no default to override: choose one with {hint.group(1) if hint else '+' + overridden.group(1) + '=NAME'}"
        )
    cause = f" ({str(error.__cause__).splitlines()[0]})" if error.__cause__ is not None else ""
    return ConfigError(f"{first}{cause}")


def _unknown_override(key: str, overrides: Sequence[str], config_name: str) -> str | None:
    """``key_problem`` for the key of a refused override, against the config composed without it;
    a parameter the yaml leaves out is added with ``+key=``."""
    rest = [o for o in overrides if re.split(r"[=@]", o.lstrip("+~"), maxsplit=1)[0] != key]
    try:
        base = _compose(rest, config_name)[0]
    except Exception:  # noqa: BLE001  (another mistake: Hydra's first line will do)
        return None
    problem = key_problem(base, key)
    if problem is not None:
        return problem
    missing = object()
    return (
        f"{key} is not in the config: add it with +{key}=..."
        if OmegaConf.select(base, key, default=missing) is missing
        else None
    )


def compose_checked(overrides: Sequence[str], config_name: str = "config") -> DictConfig:
    """:func:`compose`, where every mistake is one :class:`ConfigError` naming the key or option
    and the closest valid names, and every added key (``+key=``) is read by someone."""
    from hydra.errors import HydraException

    overrides = list(overrides)
    try:
        cfg, groups = _compose(overrides, config_name)
    except HydraException as error:
        raise explain(error, overrides, config_name) from error
    check_added_keys(overrides, groups, config_name)
    check_keys(cfg)  # a key no component takes, wherever it was written (a file of one's own, a preset)
    return cfg


# ---------------------------------------------------------------------------- command lines


def run_variants(overrides: Sequence[str], multirun: bool) -> list[list[str]]:
    """The override lists a command line runs, enough to check each value once: a sweep's first
    values together, then each further value of each sweep (``a=1,2 b=x,y``: ``a=1 b=x``,
    ``a=2 b=x``, ``a=1 b=y``). Empty when a sweep cannot be enumerated here (``glob``, ``interval``)."""
    from hydra.errors import HydraException

    parsed = _parse(overrides)
    sweeps = [o for o in parsed if o.is_sweep_override()]
    if sweeps and not multirun:
        key = sweeps[0].get_key_element()
        raise ConfigError(
            f"{sweeps[0].input_line} gives several values: add -m to run one job per value, or write {key}=[...] for a list"
        )
    try:
        values = [
            [f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()]
            if o.is_sweep_override()
            else [o.input_line]
            for o in parsed
        ]
    except HydraException:
        return []
    first = [options[0] for options in values]
    variants = [first]
    for i, options in enumerate(values):
        variants += [[*first[:i], option, *first[i + 1 :]] for option in options[1:]]
    return variants


class _UsageError(Exception):
    """Hydra's argument parser refused the command line: Hydra itself will say so."""


def check_command_line(argv: Sequence[str], config_name: str = "config") -> list[DictConfig]:
    """Compose what ``argv`` (a Hydra app's arguments) would run, before Hydra does, so that a
    mistake is one :class:`ConfigError` line rather than Hydra's message and exit 1, and build each
    one's decoder (a wrong value is one line too); the configs composed (one per sweep variant). Help, info, shell completion and another config directory
    are left to Hydra (none composed)."""
    from hydra._internal.utils import get_args_parser

    if "--version" in argv:
        return []
    parser = get_args_parser()

    def refuse(message: str) -> None:
        raise _UsageError(message)

    parser.error = refuse  # type: ignore[method-assign]
    try:
        args, _ = parser.parse_known_args(list(argv))
    except _UsageError:
        return []
    if (
        args.help
        or args.hydra_help
        or args.info
        or args.shell_completion
        or args.config_path
        or args.config_dir
        or args.experimental_rerun
    ):
        return []
    if sum(map(bool, (args.run, args.multirun, args.cfg))) > 1:  # Hydra would say so with a traceback
        raise ConfigError("only one of --run, --multirun (-m) and --cfg can be given")
    variants = run_variants(args.overrides, args.multirun)
    composed = []
    for overrides in variants:
        try:
            composed.append(compose_checked(overrides, args.config_name or config_name))
            if "decoder" in composed[-1]:
                build(composed[-1], "decoder")  # every value checked: a sweep's last job's too, before the first runs
        except ConfigError as error:
            if len(variants) == 1:
                raise
            job = [o for o in overrides if o not in args.overrides]  # the sweeps' values of this job
            raise ConfigError(f"in the job with {' '.join(job or overrides)}: {error}") from error
    return composed


# A setting given as Python data: (dotted key, value), set on the composed config by OmegaConf,
# so no value ever passes through Hydra's override grammar (paths with quotes, commas, ``${``).
Setting = tuple[str, Any]


def compose_settings(
    overrides: Sequence[str], settings: Sequence[Setting] = (), config_name: str = "config"
) -> DictConfig:
    """:func:`compose_checked` with the overrides, then each setting set on the result (later
    settings win); every mistake is one :class:`ConfigError` naming the key (the Python API and
    the server's lanes compose so)."""
    cfg = compose_checked(overrides, config_name)
    for key, value in settings:
        set_key(cfg, key, value)
    return cfg


def set_key(cfg: DictConfig, key: str, value: Any) -> None:
    """``cfg.<key> = value`` for a key someone reads (``key_problem``): a Python value, no quoting, no interpolation."""
    problem = key_problem(cfg, key)
    if problem is not None:
        raise ConfigError(problem)
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str) and "${" in value:  # OmegaConf would read it as an interpolation
        value = value.replace("${", "\\${")
    try:
        with open_dict(parent):
            parent[leaf] = OmegaConf.create(value) if isinstance(value, (Mapping, list, tuple)) else value
    except (ValueError, TypeError) as error:  # e.g. an object OmegaConf cannot hold
        raise ConfigError(f"{key}: cannot set {type(value).__name__} {value!r}: {error}") from error
