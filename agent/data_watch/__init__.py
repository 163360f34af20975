"""The data watch: batch statistics computed off the training thread, sent as ``data.stats`` events.

``config`` (``[agent.data_watch]``), ``batch`` (one batch's lengths, token sketch and novelty: pure
numpy), ``near_dup`` (MinHash signatures of shingles, banded against the batch and the recent
window), ``window`` (a window's figures -> the event's payload) and ``watcher`` (the thread the
training loop hands batches to). The agent builds one with ``Agent.watch_data`` (agent/hooks.py).
"""
