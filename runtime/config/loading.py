"""Loading the settings: a TOML file, then ``RINGMASTER__SECTION__KEY`` environment
overrides, validated by the models (models.py) and checked across sections (checks.py).

Every problem becomes one ConfigError whose message names the key (``workers.processes: ...``,
with the environment variable that set it, and the key meant when one is misspelt) so a user
can fix it at once. Runs in: the CLI, before anything touches Kafka.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from runtime.config.checks import (
    check_kafka_source,
    check_plugin_importable,
    check_topic_loops,
    guarantee_problem,
    max_message_bytes,
    members_problem,
    parse_listen,
    share_group_problems,
)
from runtime.config.models import Settings
from runtime.errors import ConfigError

ENV_PREFIX = "RINGMASTER__"


def load_settings(path: str | os.PathLike[str] | None, env: Mapping[str, str] | None = None,
                  check_plugin: bool = True) -> Settings:
    """Read, override and validate; raise ConfigError/PluginError with one readable line."""
    raw: dict[str, Any] = {}
    if path is not None:
        raw = _read_toml(Path(path))
    from_env = _apply_env_overrides(raw, os.environ if env is None else env)
    try:
        settings = Settings.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path, from_env)) from None
    max_message_bytes(settings)  # read by the runtime itself: a bad value fails here, not mid-run
    problem = members_problem(settings.supervisor.members, settings.workers.processes)
    if problem is not None:  # `ringmaster check` says it too, before any member starts
        raise ConfigError(problem)
    check_topic_loops(settings)
    if settings.spark.source == "kafka":
        check_kafka_source(settings)
    problems = share_group_problems(settings)
    if problems:
        raise ConfigError("; ".join(problems))
    problem = guarantee_problem(settings)
    if problem is not None:  # `ringmaster check` says it, before Kafka is touched
        raise ConfigError(problem)
    if settings.admin.listen:
        parse_listen(settings.admin.listen, settings.admin.allow_remote)  # the same, before any socket
    if check_plugin:
        check_plugin_importable(settings.workers.plugin)
    return settings


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {str(path)!r} cannot be read: {exc}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None


def _apply_env_overrides(raw: dict[str, Any], env: Mapping[str, str]) -> dict[tuple[str, ...], str]:
    """RINGMASTER__WORKERS__PROCESSES=4 sets workers.processes. Under kafka.consumer,
    kafka.producer and spark.conf the last part names a property with dots written as
    underscores (RINGMASTER__KAFKA__CONSUMER__FETCH_MAX_BYTES -> fetch.max.bytes). The value is
    read by the type of the key it sets (_env_value). Returns which variable set which key,
    so that an error can name the variable."""
    from_env: dict[tuple[str, ...], str] = {}
    for name, text in sorted(env.items()):
        if not name.startswith(ENV_PREFIX):
            continue
        parts = [p.lower() for p in name[len(ENV_PREFIX):].split("__") if p]
        if len(parts) < 2:
            raise ConfigError(f"environment variable {name}: expected {ENV_PREFIX}SECTION__KEY")
        if parts[:2] in (["kafka", "consumer"], ["kafka", "producer"], ["spark", "conf"]):
            parts = [*parts[:2], ".".join(parts[2:]).replace("_", ".")]
        node = raw
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"environment variable {name}: {part} is not a section")
            node = child
        node[parts[-1]] = _env_value(name, text, _key_kind(parts))
        from_env[tuple(parts)] = name
    return from_env


def _key_kind(parts: list[str]) -> str:
    """How an override of the key at `parts` is read, from the type the models give it:
    "list", "toml" (free-form plugin settings, a whole table) or "text": the string exactly as
    given – a string-typed key keeps it (a secret like ``0x1F`` stays ``0x1F``), a librdkafka
    or Spark property is parsed by its client, and for numbers, booleans and unknown keys
    pydantic validates the text and names the key when it is wrong."""
    model: type[BaseModel] = Settings
    for i, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None:
            return "text"
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
            continue
        if i < len(parts) - 1:  # a key inside a table: pass-through properties or plugin settings
            return "toml" if get_args(ann)[1:] == (Any,) else "text"
        return _type_kind(ann)
    return "toml"  # a whole section given as an inline table


def _type_kind(ann: Any) -> str:
    origin = get_origin(ann)
    if origin in (Union, UnionType):
        kinds = {_type_kind(a) for a in get_args(ann) if a is not type(None)}
        return kinds.pop() if len(kinds) == 1 else "text"
    if origin is list:
        return "list"
    if origin is dict:
        return "toml"
    return "text"


def _env_value(name: str, text: str, kind: str) -> Any:
    if kind == "toml":
        try:
            return tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            return text
    if kind == "list":
        if not text.lstrip().startswith("["):
            return [item.strip() for item in text.split(",")]
        try:
            return tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"environment variable {name}: expected a TOML array like "
                              f'["a", "b"] or a comma-separated list like a,b ({exc})') from None
    return text


def _describe(exc: ValidationError, path: Any, from_env: Mapping[tuple[str, ...], str] | None = None) -> str:
    where = f"config {str(path)!r}" if path is not None else "config"
    problems = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"])
        var = (from_env or {}).get(tuple(str(p) for p in err["loc"]))
        source = "" if var is None else f" (set by {var})"
        if err["type"] == "missing":
            problems.append(f"{key}: required key is missing")
        elif err["type"] == "extra_forbidden":
            problems.append(f"{key}: unknown key{_did_you_mean(err['loc'])}{source}")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            got = err.get("input")
            shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
            problems.append(f"{key}: {msg}{shown}{source}")
    return f"{where}: " + "; ".join(problems)


def _did_you_mean(loc: tuple[Any, ...]) -> str:
    """' (did you mean processes?)' for a misspelt key, from the keys its section has."""
    model: type[BaseModel] | None = Settings
    for part in loc[:-1]:
        field = model.model_fields.get(str(part)) if model is not None else None
        ann = field.annotation if field is not None else None
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
    if model is None:
        return ""
    known = list(model.model_fields)
    close = difflib.get_close_matches(str(loc[-1]).lower(), known, n=1, cutoff=0.6)
    if close:
        return f" (did you mean {close[0]}?)"
    section = ".".join(str(p) for p in loc[:-1])
    return f" ({section or 'sections'}: {', '.join(known)})"


def config_keys() -> dict[str, list[str]]:
    """Every configuration key, by section (``{"workers": ["plugin", ...]}``): what the
    documentation must describe (tests/unit/test_docs.py checks it does)."""
    keys: dict[str, list[str]] = {}
    for name, field in Settings.model_fields.items():
        section = field.annotation
        assert isinstance(section, type) and issubclass(section, BaseModel), name  # every section is a model
        keys[name] = list(section.model_fields)
    return keys
