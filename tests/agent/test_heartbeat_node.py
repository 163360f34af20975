"""Every heartbeat names its node (and, under the hang part, its worker group's life): the
controller keeps a node its suspect-node store holds out of a run by it (controller/suspects.py)."""

from __future__ import annotations

import time

from cliffguard.core.enums import EventType
from tests.agent.test_hooks import _setup, _step


def test_a_heartbeat_names_the_node_it_beats_for(monkeypatch):
    monkeypatch.setenv("CLIFFGUARD_NODE_ID", "gpu-07")
    model, opt, agent, sink, _ = _setup(hist_every=0)
    agent.start()
    _step(model, opt, agent)
    time.sleep(0.15)  # heartbeat_s 0.05
    agent.close()
    beats = [e for e in sink.events if e.type is EventType.HEARTBEAT]
    assert beats and all(b.data["node"] == "gpu-07" for b in beats)
    assert all(b.data["life"] == 0 for b in beats)  # the hang part is on by default: life 0 outside torchrun
