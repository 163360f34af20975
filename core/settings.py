"""One way to build every component's config: TOML file < ``CLIFFGUARD_*`` env < flags.

Each component owns a ``@dataclass(kw_only=True, slots=True)`` config whose ``__post_init__``
raises ``ValueError`` for a bad value (a field's range or choices are declared on the field and
checked by ``core.declared.check_declared``; what relates two fields is written there by hand).
``build_config`` fills one from the three sources in order of precedence and, when anything is
wrong, raises ``ConfigError`` naming the field *and the source it came from*
(``kafka.bootstrap (from env CLIFFGUARD_KAFKA__BOOTSTRAP): ...``), so a bad value fails at
start, not at 3 a.m.

Naming: section ``kafka`` field ``bootstrap`` is ``[kafka] bootstrap = ...`` in TOML,
``CLIFFGUARD_KAFKA__BOOTSTRAP`` in the environment (double underscore between section and field)
and ``{"bootstrap": ...}`` in the flags mapping the CLI passes for that section.

Shared fields: a setting every process must agree on (the spike rule, the rollback policy, Kafka)
is one section of the deployment config (``core/deployment.py``). A component that needs it
declares the field with ``shared_field("spike", SpikeConfig)``: ``build_config`` then takes its
value from ``shared={"spike": ...}`` (what the one resolver, ``cliffguard/config.py``, resolved)
and refuses to read it from the component's own section, so there is one place to set it. A
class attribute ``MOVED = {"old_field": "[section] field"}`` does the same for a field that
moved to a shared section, so an old config file fails at start naming the new place.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
ENV_PREFIX = "CLIFFGUARD_"
SHARED = "cliffguard.shared_section"
"""Field metadata key: the deployment section whose value the field carries."""


class ConfigError(ValueError):
    def __init__(self, field: str, source: str, reason: str) -> None:
        super().__init__(f"{field} (from {source}): {reason}")
        self.field = field
        self.source = source
        self.reason = reason


def shared_field(section: str, default_factory: Callable[[], Any]) -> Any:
    """A field whose value is the deployment's ``[section]``, handed in by the resolver.

    Its default (``default_factory()``) is the section's default, for components built in code."""
    return dataclasses.field(default_factory=default_factory, metadata={SHARED: section})


def shared_sections(cls: type) -> dict[str, str]:
    """Field name -> deployment section, for ``cls``'s shared fields."""
    return {f.name: f.metadata[SHARED] for f in dataclasses.fields(cls) if SHARED in f.metadata}


def _elsewhere(cls: type, key: str) -> str | None:
    """Where ``key`` is set instead, when it is a shared field or a field that moved (``MOVED``)."""
    carried = shared_sections(cls)
    if key in carried:
        return f"set it in [{carried[key]}], the one section every process reads"
    moved = getattr(cls, "MOVED", {})
    if key in moved:
        return f"moved: set it as {moved[key]}, the one place every process reads"
    return None


def load_toml(path: str | Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    p = Path(path)
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError("config file", str(p), "no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("config file", str(p), f"invalid TOML: {exc}") from None


def _coerce(value: Any, hint: Any, from_text: bool) -> Any:
    """Turn a TOML value or an env/flag string into the field's declared type."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None or (from_text and value in ("", "none", "None", "null")):
            if type(None) in args:
                return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, from_text)
            except (TypeError, ValueError) as exc:
                errors.append(str(exc))
        raise ValueError("; ".join(errors) or f"cannot use {value!r}")
    if hint is bool:
        if isinstance(value, bool):
            return value
        if from_text and isinstance(value, str):
            low = value.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
        raise ValueError(f"expected true/false, got {value!r}")
    if hint is int:
        if isinstance(value, bool):
            raise ValueError(f"expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if from_text and isinstance(value, str):
            return int(value.strip())
        raise ValueError(f"expected an integer, got {value!r}")
    if hint is float:
        if isinstance(value, bool):
            raise ValueError(f"expected a number, got {value!r}")
        if isinstance(value, (int, float)):
            return float(value)
        if from_text and isinstance(value, str):
            return float(value.strip())
        raise ValueError(f"expected a number, got {value!r}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ValueError(f"expected a string, got {value!r}")
    if origin in (list, tuple):
        if from_text and isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"expected a list, got {value!r}")
        inner = args[0] if args else Any
        items = [v if inner is Any else _coerce(v, inner, from_text) for v in value]
        return tuple(items) if origin is tuple else items
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if isinstance(value, hint):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(f"expected a table for {hint.__name__}, got {value!r}")
        sub_hints = typing.get_type_hints(hint)
        unknown = set(value) - set(sub_hints)
        if unknown:
            raise ValueError(f"unknown field(s) {', '.join(sorted(unknown))} in {hint.__name__}")
        return hint(**{k: _coerce(v, sub_hints[k], from_text) for k, v in value.items()})
    if origin is dict or hint is dict:
        if not isinstance(value, Mapping):
            raise ValueError(f"expected a table, got {value!r}")
        return dict(value)
    return value


def build_config(
    cls: type[T],
    section: str,
    *,
    toml: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
    toml_source: str = "config file",
    shared: Mapping[str, Any] | None = None,
) -> T:
    """Build ``cls`` for ``section`` from TOML < env < flags; errors name field and source.

    ``shared`` maps deployment sections to their resolved values; every ``shared_field`` (at any
    depth) takes its value from there (its default when the section is not given) and setting it
    in this section's TOML, env or flags is an error naming the section to use instead."""
    env = os.environ if env is None else env
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    carried = shared_sections(cls)
    for name, to in carried.items():
        if shared is not None and to in shared:
            values[name] = shared[to]

    # Nested config dataclasses (agent.guard, ...) are sections of their own: [agent.guard] in
    # TOML, CLIFFGUARD_AGENT__GUARD__HOLD_AFTER in the environment, flags={"guard": {...}}.
    nested = {n for n in names if dataclasses.is_dataclass(hints[n]) and isinstance(hints[n], type)} - set(carried)
    for name in nested:
        sub_flags = (flags or {}).get(name)
        values[name] = build_config(
            hints[name],
            f"{section}.{name}",
            toml=toml,
            env=env,
            flags=sub_flags if isinstance(sub_flags, Mapping) else None,
            toml_source=toml_source,
            shared=shared,
        )

    table: Any = toml or {}
    for part in section.split("."):
        table = table.get(part, {}) if isinstance(table, Mapping) else {}
    table = {k: v for k, v in dict(table or {}).items() if k not in nested}
    def take(key: str, raw: Any, where: str, from_text: bool, known: bool = True) -> None:
        """One value from one source, checked; the error names the field and the source."""
        if (instead := _elsewhere(cls, key)) is not None:
            raise ConfigError(f"{section}.{key}", where, instead)
        if key not in names:
            listing = f"; known: {', '.join(sorted(names))}" if known else ""
            raise ConfigError(f"{section}.{key}", where, f"unknown field{listing}")
        try:
            values[key] = _coerce(raw, hints[key], from_text=from_text)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{section}.{key}", where, str(exc)) from None
        sources[key] = where

    for key, raw in table.items():
        take(key, raw, f"{toml_source} [{section}]", from_text=False)

    prefix = f"{ENV_PREFIX}{section.upper().replace('.', '__')}__"
    for var, raw in env.items():
        if not var.startswith(prefix):
            continue
        key = var[len(prefix):].lower()
        where = f"env {var}"
        head = key.split("__", 1)[0]
        if (instead := _elsewhere(cls, head)) is not None:
            raise ConfigError(f"{section}.{head}", where, instead)
        if "__" in key:
            continue  # belongs to a nested section
        take(key, raw, where, from_text=True)

    for key, raw in (flags or {}).items():
        if raw is None or key in nested:
            continue  # a flag that was not given, or a nested section handled above
        take(key, raw, f"flag --{key.replace('_', '-')}", from_text=isinstance(raw, str), known=False)

    try:
        return cls(**values)
    except ValueError as exc:
        # __post_init__ messages start with the field name: "window: must be >= 8".
        msg = str(exc)
        field = msg.split(":", 1)[0].strip()
        where = sources.get(field, "default")
        raise ConfigError(f"{section}.{field}", where, msg.split(":", 1)[-1].strip()) from None


def config_to_dict(cfg: Any, *, with_shared: bool = True) -> dict[str, Any]:
    """A config as plain data, for saving with the run. Secrets (``Secret``, ``repr=False`` fields)
    are masked. ``with_shared=False`` leaves out shared fields (printed once, as their own sections)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        if not with_shared and SHARED in f.metadata:
            continue
        v = getattr(cfg, f.name)
        if not f.repr and v is not None:
            v = "********"  # fields kept out of repr (passwords) are kept out of saved configs too
        elif dataclasses.is_dataclass(v):
            v = config_to_dict(v, with_shared=with_shared)
        elif not isinstance(v, (int, float, str, bool, list, tuple, dict, type(None))):
            v = repr(v)
        out[f.name] = v
    return out
