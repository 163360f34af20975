"""A ``--json`` command's standard output holds its JSON document and nothing else.

Libraries print to standard output on their own: DeepSpeed's logger writes to ``sys.stdout``,
accelerate imports DeepSpeed whenever it is installed, and its first line ("Setting accelerator to
CPU") made ``cliffguard hpo --json``'s output unreadable. So while such a command runs, ``cli.main``
points ``sys.stdout`` at standard error (``held``): whatever else prints there is still seen, and
the command writes its document with ``emit``, to the standard output it was started with.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TextIO

_started_with: list[TextIO] = []


@contextlib.contextmanager
def held() -> Iterator[None]:
    _started_with.append(sys.stdout)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _started_with.pop()


def emit(text: str) -> None:
    """Write a JSON document (one ``print``'s worth) to the command's real standard output."""
    out = _started_with[-1] if _started_with else sys.stdout
    print(text, file=out, flush=True)


def wants_json_stdout(args: object) -> bool:
    """The command was asked for JSON on standard output (a ``--json`` flag, or ``--json -``)."""
    value = getattr(args, "json", None)
    return value is True or value == "-"
