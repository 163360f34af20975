"""Test helpers shared by the test suite (``tests/``) and the benchmarks (``bench/``).

Real parts, driven the way a trainer or an operator drives them: a scripted trainer over the real
broker (``controller_service``), stores and a controller stack (``controller_stack``), alert
receivers (``alerts``), event factories (``store_factory``), a small bundled-trainer set-up
(``trainer``), a filled dashboard store (``dashboard_fill``) and headless Chromium (``browser``).
Nothing in ``cliffguard`` imports this package (tests/test_import_graph.py).
"""
