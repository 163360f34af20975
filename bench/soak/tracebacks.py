"""Python tracebacks in a log (pure): each logged record (a chain of ``During handling of the above
exception`` blocks is one record) with the logger that wrote it, its exception line, and whether it
is *ours*: a frame of this project's code, or no logger at all (an uncaught exception the
interpreter printed). The rest were logged by a library from its own frames only, as kafka-python
does with ``log.exception`` when a broker drops a socket."""

from __future__ import annotations

import re
from dataclasses import dataclass

_HEADER = "Traceback (most recent call last):"
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
_FRAME = re.compile(r'^\s+File "([^"]+)", line \d+')
_LOGGER = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (?:r\d+ )?([A-Za-z_][\w.]*): ")


@dataclass
class Traceback:
    logger: str | None
    exception: str
    frames: list[str]

    @property
    def ours(self) -> bool:
        if self.logger is None or self.logger.startswith("cliffguard"):
            return True
        return any(_our_frame(f) for f in self.frames)


def _our_frame(path: str) -> bool:
    if "/site-packages/cliffguard/" in path:
        return True
    return "/site-packages/" not in path and "/lib/python3." not in path


def find(text: str) -> list[Traceback]:
    found: list[Traceback] = []
    previous = ""
    current: Traceback | None = None
    in_block = False
    for line in text.splitlines():
        if line.startswith(_HEADER):
            if current is not None and previous.startswith(_CHAINED):
                in_block = True  # the same record goes on
            else:
                m = _LOGGER.search(previous)
                current = Traceback(m.group(1) if m else None, "?", [])
                found.append(current)
                in_block = True
        elif in_block and current is not None:
            frame = _FRAME.match(line)
            if frame:
                current.frames.append(frame.group(1))
            elif line and not line.startswith((" ", "\t")):
                current.exception = line
                in_block = False
        if line.strip():
            previous = line
    return found
