"""Code every cliffguard process shares: the event contract, its enums, the non-finite float
codec, command signing, Kafka settings, the spike rule, the recovery policy constants and the
config loader.

``core`` imports nothing else of the project. ``agent`` (the in-process runtime), ``trainer``,
``controller``, ``dashboard`` and ``cliffguard`` import it; none of them imports ``agent`` except
the trainer and the integrations (``tests/test_import_graph.py`` holds that line).
"""
