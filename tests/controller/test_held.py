"""HeldBatch: every assigned partition paused while a batch is held, resumed on release."""

from __future__ import annotations

from cliffguard.controller.edge_classify import EdgeBatch
from cliffguard.controller.held import HeldBatch
from cliffguard.controller.store.errors import Backoff


class Edge:
    def __init__(self) -> None:
        self.paused: set = set()

    def assignment(self):
        return [("m", 0), ("m", 1), ("m", 2)]

    def pause(self, tps):
        self.paused |= set(tps)

    def resume(self, tps):
        self.paused -= set(tps)


def test_holding_pauses_everything_and_release_resumes_it():
    now = [100.0]
    held, edge = HeldBatch(Backoff(1.0, 4.0), clock=lambda: now[0]), Edge()
    held.hold(EdgeBatch(next_offsets={("m", 1): 7}), edge)
    assert edge.paused == {("m", 0), ("m", 1), ("m", 2)} and held.batch is not None
    assert [held.wait_transient() for _ in range(4)] == [1.0, 2.0, 4.0, 4.0]
    assert held.wait_left_s() == 4.0
    held.release(edge)
    assert edge.paused == set() and held.batch is None and held.transient_failures == 0
    held.hold(EdgeBatch(), None)  # an edge without pause/resume (or none yet) is fine
    held.release(None)
