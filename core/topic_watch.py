"""Notice that a topic was deleted and created again under the same name.

Offsets restart at 0 in a re-created topic, so a position kept from the old one can be valid
there and silently skip its first messages (a restarted in-memory broker does exactly this).
Topic ids (KIP-516) come from kafka-python's cluster metadata; with a client or broker that
has none, ``changed`` never fires and callers fall back to their ordinary offset handling.
"""

from __future__ import annotations

from typing import Any


def topic_id_of(client: Any, topic: str) -> object:
    """The topic's id in a kafka-python client's cluster metadata (None when it has none)."""
    cluster = getattr(getattr(client, "_client", None), "cluster", None)
    return getattr(cluster, "topic_id", lambda _t: None)(topic)


class TopicIdWatch:
    def __init__(self, topic: str) -> None:
        self.topic = topic
        self._topic_id: object = None

    @property
    def last_seen(self) -> object:
        """The id seen by the latest ``changed`` call (None before one saw it)."""
        return self._topic_id

    def changed(self, consumer: Any) -> bool:
        """Has the topic's id changed since the last call? (False the first time it is seen.)"""
        topic_id = topic_id_of(consumer, self.topic)
        if topic_id is None:
            return False
        changed = self._topic_id is not None and topic_id != self._topic_id
        self._topic_id = topic_id
        return changed
