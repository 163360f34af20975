"""Notice that a topic was deleted and created again under the same name.

Offsets restart at 0 in a re-created topic, so a position kept from the old one can be valid
there and silently skip its first messages (a restarted in-memory broker does exactly this).
Topic ids (KIP-516) come from kafka-python's cluster metadata; with a client or broker that
has none, ``changed`` never fires and callers fall back to their ordinary offset handling.
"""

from __future__ import annotations

from typing import Any


class TopicIdWatch:
    def __init__(self, topic: str) -> None:
        self.topic = topic
        self._topic_id: object = None

    def changed(self, consumer: Any) -> bool:
        """Has the topic's id changed since the last call? (False the first time it is seen.)"""
        cluster = getattr(getattr(consumer, "_client", None), "cluster", None)
        topic_id = getattr(cluster, "topic_id", lambda _t: None)(self.topic)
        if topic_id is None:
            return False
        changed = self._topic_id is not None and topic_id != self._topic_id
        self._topic_id = topic_id
        return changed
