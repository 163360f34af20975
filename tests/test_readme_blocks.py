"""Docs that run: every ```python block of README.md is executed as written, in a fresh
interpreter, against the embedded broker (``CLIFFGUARD_KAFKA__*`` in its environment, as a user's
deployment would set them), and must leave a finished run on the broker.

A block may declare setup that runs before it in an HTML comment right above it::

    <!-- readme-setup
    import torch
    model = ...
    -->
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition

from cliffguard.core.enums import EventType
from cliffguard.core.events import decode_event

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(?:<!--\s*readme-setup\n(?P<setup>.*?)-->\s*\n)?```python\n(?P<code>.*?)```", re.DOTALL)


def readme_blocks(text: str) -> list[tuple[str, str]]:
    """(setup, code) of every ```python block, in order."""
    return [(m.group("setup") or "", m.group("code")) for m in BLOCK.finditer(text)]


BLOCKS = readme_blocks((ROOT / "README.md").read_text())


def test_blocks_and_their_setup_are_found():
    text = "x\n<!-- readme-setup\nA = 1\n-->\n```python\nprint(A)\n```\n```bash\nls\n```\n```python\nB = 2\n```\n"
    assert readme_blocks(text) == [("A = 1\n", "print(A)\n"), ("", "B = 2\n")]
    assert BLOCKS, "README.md has no python block"


def _events(kafka_cfg, deadline_s: float) -> list:
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


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_block_runs_as_written(index, kafka_cfg, tmp_path):
    setup, code = BLOCKS[index]
    script = tmp_path / f"readme_block_{index}.py"
    script.write_text(setup + code)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLIFFGUARD_")}
    env.update(PYTHONPATH=str(ROOT), CLIFFGUARD_KAFKA__BOOTSTRAP=kafka_cfg.bootstrap,
               CLIFFGUARD_KAFKA__TOPIC_PREFIX=kafka_cfg.topic_prefix,
               CLIFFGUARD_KAFKA__PARTITIONS=str(kafka_cfg.partitions),
               CLIFFGUARD_COMMAND_SECRET="readme-block-secret-0123456789")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, f"block {index} failed:\n{code}\n{done.stderr[-3000:]}"
    events = _events(kafka_cfg, 30)
    types = [e.type for e in events]
    assert EventType.RUN_STARTED in types and EventType.STEP in types, f"block {index} sent {set(types)}"
    assert types.count(EventType.RUN_FINISHED) == 1 and EventType.RUN_FAILED not in types
