"""The publisher's link as a declared state machine (agent/publisher_link.py): the table's moves
only, and an outage through a real Publisher takes declared moves in the expected order."""

from __future__ import annotations

import pytest

from cliffguard.agent.publisher import Publisher
from cliffguard.agent.publisher_link import MOVES, Link, LinkEvent, LinkState, MoveNotDeclared
from cliffguard.core.kafka_config import KafkaConfig
from tests.agent.test_publisher import FakeCluster, _cfg, _hb, _wait


def test_every_state_is_reachable_and_closed_is_final():
    assert set(MOVES.values()) == set(LinkState)
    assert not [m for m in MOVES if m[0] is LinkState.CLOSED]


def test_an_undeclared_move_raises_and_changes_nothing():
    link = Link()
    with pytest.raises(MoveNotDeclared, match="spill_drained is not a move from down"):
        link.move(LinkEvent.SPILL_DRAINED)
    assert link.state is LinkState.DOWN and not link.history and not link.up
    assert link.move(LinkEvent.CONNECTED) is LinkState.REPLAYING and link.up


def test_an_outage_and_its_return_take_only_declared_moves_in_order(tmp_path):
    cluster = FakeCluster(up=True)
    pub = Publisher(KafkaConfig(bootstrap="127.0.0.1:9", topic_prefix="unit"), _cfg(tmp_path), producer_factory=cluster.factory).start()
    pub.publish(_hb(0))
    assert _wait(lambda: len(cluster.acked) == 1)
    cluster.up = False
    pub.publish(_hb(1))
    assert _wait(lambda: pub.stats()["spill_pending"] == 1)
    cluster.up = True
    assert _wait(lambda: pub.stats()["spill_pending"] == 0 and pub.stats()["broker_up"])
    pub.close(5)
    taken = list(pub.link.history)
    assert all(MOVES[(before, event)] is after for before, event, after in taken)  # every move declared
    events = [event for _, event, _ in taken]
    assert events == [LinkEvent.CONNECTED, LinkEvent.SPILL_DRAINED, LinkEvent.SEND_FAILED, LinkEvent.CONNECTED,
                      LinkEvent.SPILL_DRAINED, LinkEvent.SHUT_DOWN]
    assert pub.link.state is LinkState.CLOSED and [s for s, *_ in taken][0] is LinkState.DOWN
