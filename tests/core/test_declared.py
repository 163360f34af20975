"""Declared field checks: each kind accepts at its edge, rejects past it with the exact message,
runs when a config is built in code, and reaches the loader's error with its source."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from cliffguard.core.declared import bounded, check_declared, declared_checks, non_empty, one_of
from cliffguard.core.settings import ConfigError, build_config

MODES = ("fast", "slow")


@dataclass(kw_only=True, slots=True)
class Sample:
    name: str = non_empty("x")
    label: str = non_empty("y", reason="must be set")
    at_least: int = bounded(8, ge=8)
    above: float = bounded(1.0, gt=0)
    at_most: int = bounded(0, le=10)
    below: float = bounded(0.0, lt=1)
    closed: int = bounded(0, ge=0, le=19)
    open_: float = bounded(0.5, gt=0, lt=1)
    half_open: float = bounded(0.0, ge=0, lt=1)
    open_closed: float = bounded(1.0, gt=0, le=1)
    with_why: int = bounded(0, ge=0, why="0: off")
    worded: int = bounded(0, ge=0, le=65535, reason="must be 0 (off) or a TCP port")
    optional: float | None = bounded(None, gt=0)
    mode: str = one_of("fast", MODES)
    worded_mode: str = one_of("thread", ("thread",), reason="must be 'thread' (the only writer)")

    def __post_init__(self) -> None:
        check_declared(self)


@pytest.mark.parametrize(("field", "ok", "bad", "message"), [
    ("name", "a", "", "name: must not be empty"),
    ("label", "a", "", "label: must be set"),
    ("at_least", 8, 7, "at_least: must be >= 8"),
    ("above", 1e-9, 0.0, "above: must be > 0"),
    ("at_most", 10, 11, "at_most: must be <= 10"),
    ("below", 0.999, 1.0, "below: must be < 1"),
    ("closed", 19, 20, "closed: must be in [0, 19]"),
    ("closed", 0, -1, "closed: must be in [0, 19]"),
    ("open_", 0.999, 1.0, "open_: must be in (0, 1)"),
    ("open_", 1e-9, 0.0, "open_: must be in (0, 1)"),
    ("half_open", 0.0, 1.0, "half_open: must be in [0, 1)"),
    ("open_closed", 1.0, 0.0, "open_closed: must be in (0, 1]"),
    ("with_why", 0, -1, "with_why: must be >= 0 (0: off)"),
    ("worded", 65535, 65536, "worded: must be 0 (off) or a TCP port"),
    ("optional", 1e-9, 0.0, "optional: must be > 0"),
    ("mode", "slow", "medium", "mode: must be one of fast, slow"),
    ("worded_mode", "thread", "process", "worded_mode: must be 'thread' (the only writer)"),
])
def test_each_kind_accepts_at_its_edge_and_rejects_past_it(field, ok, bad, message):
    assert getattr(Sample(**{field: ok}), field) == ok
    with pytest.raises(ValueError) as err:
        Sample(**{field: bad})
    assert str(err.value) == message


def test_none_passes_only_a_field_whose_default_is_none():
    assert Sample(optional=None).optional is None
    with pytest.raises(TypeError):
        Sample(above=None)  # not optional: the comparison itself fails, as a hand-written one did


def test_nan_fails_every_bound():
    for field in ("above", "below", "half_open", "open_closed"):
        with pytest.raises(ValueError, match=f"^{field}: "):
            Sample(**{field: float("nan")})


def test_the_first_failing_field_in_declaration_order_is_reported():
    with pytest.raises(ValueError, match="^at_least: "):
        Sample(at_least=0, mode="medium")


def test_a_declaration_without_default_is_a_required_field():
    @dataclass(kw_only=True, slots=True)
    class Run:
        run: str = non_empty(reason="must be set")
        steps: int = bounded(ge=1)

        def __post_init__(self) -> None:
            check_declared(self)

    with pytest.raises(TypeError):
        Run(steps=1)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="^steps: must be >= 1$"):
        Run(run="r", steps=0)
    assert Run(run="r", steps=1).steps == 1


def test_declared_checks_lists_the_fields_that_declare_one():
    checks = declared_checks(Sample)
    assert list(checks) == [f.name for f in dataclasses.fields(Sample)]
    assert checks["at_least"].reason == "must be >= 8"


@pytest.mark.parametrize("kwargs", [{"ge": 0, "gt": 0}, {"le": 1, "lt": 1}, {}])
def test_a_bound_is_declared_once_per_side(kwargs):
    with pytest.raises(TypeError):
        bounded(0, **kwargs)


def test_the_loader_names_the_field_and_its_source():
    with pytest.raises(ConfigError) as err:
        build_config(Sample, "sample", env={"CLIFFGUARD_SAMPLE__AT_LEAST": "7"})
    assert str(err.value) == "sample.at_least (from env CLIFFGUARD_SAMPLE__AT_LEAST): must be >= 8"
    with pytest.raises(ConfigError) as err:
        build_config(Sample, "sample", toml={"sample": {"mode": "medium"}}, env={}, toml_source="c.toml")
    assert str(err.value) == "sample.mode (from c.toml [sample]): must be one of fast, slow"
