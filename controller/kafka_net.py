"""kafka-python's slow-task warning, sized for a process that has work of its own.

kafka-python 3 runs its network I/O on a thread of its own and logs ``Task ... ran for 0.24s
(>0.100s threshold). It is blocking the event loop -- likely a tight sync loop`` when one step of a
task takes more than 0.1 s of wall-clock time. In the controller that step is
``KafkaTCPTransport._read_from_sock`` draining a large fetch response 4 KiB per ``recv`` (a backlog
after a restart, or a controller behind its trainers): each ``recv`` gives up the GIL and then waits
to get it back from the thread processing the previous batch, and on shared cores for the CPU too.
Measured on this machine: such steps took 0.12-0.24 s of wall-clock for 0.03 s of CPU on their own
thread (a 27 MB backlog, one main thread busy), so the warning reports a stalled I/O thread, not a
livelock, and nothing is lost by it (the consumer's ``poll`` waits that much longer).

``net_client_kwargs`` gives the controller's consumer a threshold of ``SLOW_TASK_S`` through
kafka-python's documented ``kafka_client`` factory (``slow_task_threshold_secs`` is a setting of
its network selector, not of ``KafkaConsumer``): a step of a second or more is still reported.
"""

from __future__ import annotations

import functools
from typing import Any

SLOW_TASK_S = 1.0
"""Wall-clock seconds one kafka-python task step may take before it is logged as blocking."""


def net_client_kwargs() -> dict[str, Any]:
    """``KafkaConsumer``/``KafkaProducer`` keyword arguments: the network client with ``SLOW_TASK_S``."""
    from kafka.net.compat import KafkaNetClient

    return {"kafka_client": functools.partial(KafkaNetClient, slow_task_threshold_secs=SLOW_TASK_S)}
