"""Docs that run: every ```python block of README.md and of every docs/**/*.md page is executed as
written, in a fresh interpreter, against the embedded broker (``CLIFFGUARD_KAFKA__*`` in its
environment, as a user's deployment would set them), and must leave a finished run on the broker.

A block may declare code that runs before it, and code that runs after it, in HTML comments right
above and right below it (a toy model, or the loop a short snippet plugs into)::

    <!-- readme-setup
    import torch
    model = ...
    -->
    ```python
    ...
    ```
    <!-- readme-after
    for batch in loader: ...
    -->

A block that cannot run alone says so, with a reason, right above it: ``<!-- not run: reason -->``.
Every ```python fence of a page must be one of the two (the parser's count is checked against a
plain count of the fences, so a block the parser misses fails instead of going unrun).

The shell blocks are checked too: every ``cliffguard <command>`` they run is a real subcommand and
every ``python -m <module>`` an importable module; the README keeps its two set-up commands (the
demo and the tests) on its first screen.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from cliffguard.cli import SUBCOMMANDS

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(
    r"(?:<!--\s*readme-setup\n(?P<setup>.*?)-->\s*\n|<!--\s*not run:(?P<skip>[^\n]*?)-->\s*\n)?"
    r"```python\n(?P<code>.*?)```[ \t]*\n?"
    r"(?:\s*<!--\s*readme-after\n(?P<after>.*?)-->)?",
    re.DOTALL)
FENCE = re.compile(r"^[ \t]*```[ \t]*python\b", re.MULTILINE)
SHELL = re.compile(r"```(?:bash|sh|shell)\n(?P<code>.*?)```", re.DOTALL)
CLIFFGUARD_CMD = re.compile(r"(?:^|[\s;&|(])(?:python3? -m )?cliffguard (?P<sub>[a-z][a-z-]*)")
PYTHON_MODULE = re.compile(r"(?:^|[\s;&|(])python3? -m (?P<mod>[A-Za-z_][\w.]*)")
FIRST_SCREEN = 30
"""Lines of the README a reader sees before scrolling: where the set-up commands must be."""


@dataclass(frozen=True)
class Block:
    page: str
    index: int
    setup: str
    code: str
    after: str
    skip_reason: str | None

    @property
    def id(self) -> str:
        return f"{self.page}:{self.index}"


def python_blocks(text: str, page: str = "page") -> list[Block]:
    """Every ```python block of ``text``, in order, with its setup, its after-part and its mark."""
    return [Block(page, i, m.group("setup") or "", m.group("code"), m.group("after") or "",
                  None if m.group("skip") is None else m.group("skip").strip())
            for i, m in enumerate(BLOCK.finditer(text))]


def _page_name(path: Path) -> str:
    return str(path.relative_to(ROOT))


TEXTS = {_page_name(p): p.read_text() for p in PAGES}
BLOCKS = [b for name, text in TEXTS.items() for b in python_blocks(text, name)]
RUN = [b for b in BLOCKS if b.skip_reason is None]


def test_blocks_their_setup_after_part_and_marks_are_found():
    text = ("x\n<!-- readme-setup\nA = 1\n-->\n```python\nprint(A)\n```\n<!-- readme-after\nprint(2)\n-->\n"
            "```bash\nls\n```\n```python\nB = 2\n```\n<!-- not run: needs a GPU -->\n```python\nC = 3\n```\n")
    got = [(b.setup, b.code, b.after, b.skip_reason) for b in python_blocks(text)]
    assert got == [("A = 1\n", "print(A)\n", "print(2)\n", None), ("", "B = 2\n", "", None),
                   ("", "C = 3\n", "", "needs a GPU")]
    assert RUN, "README.md and docs/ have no python block to run"


@pytest.mark.parametrize("page", sorted(TEXTS))
def test_every_python_block_of_a_page_is_run_or_marked_with_a_reason(page):
    blocks = [b for b in BLOCKS if b.page == page]
    fences = len(FENCE.findall(TEXTS[page]))
    assert len(blocks) == fences, (f"{page}: {fences} ```python fences but {len(blocks)} blocks found: one is "
                                   "written so that the runner misses it (indented? a space after ```?)")
    unreasoned = [b.id for b in blocks if b.skip_reason == ""]
    assert not unreasoned, f"'<!-- not run: -->' needs a reason: {unreasoned}"


def test_readme_keeps_the_demo_and_the_test_command_on_its_first_screen():
    first = "\n".join(TEXTS["README.md"].splitlines()[:FIRST_SCREEN])
    assert "python3 -m pip install -e '.[all]' && python3 -m cliffguard demo" in first
    assert "bash scripts/test.sh" in first and (ROOT / "scripts" / "test.sh").is_file()


@pytest.mark.parametrize("page", sorted(TEXTS))
def test_shell_blocks_name_real_commands_and_modules(page):
    shell = "\n".join(m.group("code") for m in SHELL.finditer(TEXTS[page]))
    unknown = sorted({m.group("sub") for m in CLIFFGUARD_CMD.finditer(shell)} - set(SUBCOMMANDS))
    assert not unknown, f"{page}: no such cliffguard command: {unknown}"
    missing = sorted({m.group("mod") for m in PYTHON_MODULE.finditer(shell)
                      if importlib.util.find_spec(m.group("mod")) is None})
    assert not missing, f"{page}: no such module: {missing}"


def _events(kafka_cfg, deadline_s: float) -> list:
    from kafka import KafkaConsumer, TopicPartition

    from cliffguard.core.enums import EventType
    from cliffguard.core.events import decode_event

    consumer = KafkaConsumer(**kafka_cfg.client_kwargs(), enable_auto_commit=False, auto_offset_reset="earliest")
    parts = [TopicPartition(kafka_cfg.metrics_topic, p) for p in range(kafka_cfg.partitions)]
    consumer.assign(parts)
    consumer.seek_to_beginning(*parts)
    out: list = []
    end = time.monotonic() + deadline_s
    try:
        while time.monotonic() < end:
            for msgs in consumer.poll(timeout_ms=300).values():
                out += [decode_event(m.value) for m in msgs]
            if any(e.type in (EventType.RUN_FINISHED, EventType.RUN_FAILED) for e in out):
                break
    finally:
        consumer.close()
    return out


@pytest.mark.broker
@pytest.mark.parametrize("block", RUN, ids=[b.id for b in RUN])
def test_python_block_runs_as_written(block: Block, kafka_cfg, tmp_path):
    from cliffguard.core.enums import EventType

    script = tmp_path / f"block_{block.index}.py"
    script.write_text(block.setup + block.code + block.after)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLIFFGUARD_")}
    env.update(PYTHONPATH=str(ROOT), CLIFFGUARD_KAFKA__BOOTSTRAP=kafka_cfg.bootstrap,
               CLIFFGUARD_KAFKA__TOPIC_PREFIX=kafka_cfg.topic_prefix,
               CLIFFGUARD_KAFKA__PARTITIONS=str(kafka_cfg.partitions),
               CLIFFGUARD_COMMAND_SECRET="readme-block-secret-0123456789")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, f"{block.id} failed:\n{block.code}\n{done.stderr[-3000:]}"
    events = _events(kafka_cfg, 30)
    types = [e.type for e in events]
    assert EventType.RUN_STARTED in types and EventType.STEP in types, f"{block.id} sent {set(types)}"
    assert types.count(EventType.RUN_FINISHED) == 1 and EventType.RUN_FAILED not in types
