"""Fault injection against the real parts; ``python -m bench.faults --help`` (see __main__.py)."""
