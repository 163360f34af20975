"""Goodput: every second of a run booked in exactly one bucket, from the events the controller
already receives (no clock of its own on the training thread).

- ``buckets.py``: the buckets, what each means, and which an incident is charged with;
- ``marks.py``: the declared table from an event (kind, command, status) to how it books time;
- ``ledger.py``: the pure ledger (events in, buckets out; ``state_dict``/``load_state_dict``);
- ``counterfactual.py``: the checkpoint interval's expected cost (Young/Daly);
- ``config.py``: ``[goodput]``; ``book.py``: the ledgers at the controller's batch (store, alerts);
- ``metrics.py``: the Prometheus ``/metrics`` endpoint.

The page that explains the model: docs/goodput.md.
"""
