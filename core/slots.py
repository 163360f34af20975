"""Building frozen slots dataclasses from values already checked, without their ``__init__``.

A frozen dataclass's ``__init__`` stores each field with ``object.__setattr__`` (its own
``__setattr__`` refuses), which costs more than the controller's decoding of an event's data
(core/batch_decode.py). ``slot_builder`` stores the fields through the slot descriptors instead:
the same object, with no defaults applied and nothing checked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def slot_builder(cls: type) -> Callable[..., Any]:
    """A function ``build(field1, field2, ...)`` (every slot, in ``__slots__`` order, positional)
    that returns a new ``cls``. Generated like the dataclass methods are, so it is one call."""
    names: tuple[str, ...] = cls.__slots__  # type: ignore[attr-defined]
    ns: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    ns.update({f"_set_{name}": cls.__dict__[name].__set__ for name in names})
    body = "".join(f"    _set_{name}(obj, {name})\n" for name in names)
    exec(f"def build({', '.join(names)}):\n    obj = _new(_cls)\n{body}    return obj\n", ns)  # noqa: S102
    build = ns["build"]
    build.__qualname__ = build.__name__ = f"build_{cls.__name__}"
    return build
