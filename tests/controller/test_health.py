"""/healthz and /readyz: pure verdicts from a snapshot, served over HTTP."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from cliffguard.controller.health import HealthServer, HealthSnapshot, liveness, readiness

READY = HealthSnapshot(loop_at=100.0, store_error="", broker_connected=True, assigned=2)


def test_liveness_fails_only_when_the_loop_stops_coming_round():
    assert liveness(HealthSnapshot(), 1e6, 30).ok  # not started yet: the first group join is slow
    assert liveness(READY, 129.0, 30).ok
    dead = liveness(READY, 131.0, 30)
    assert not dead.ok and "31 s" in dead.reason


def test_readiness_names_what_is_missing():
    assert readiness(READY).reason == "ready"
    assert readiness(HealthSnapshot(loop_at=1, store_error="OperationalError: database is locked",
                                    broker_connected=True, assigned=1)).reason.startswith("store not writable")
    assert readiness(HealthSnapshot(loop_at=1, broker_connected=False, assigned=1)).reason == "no broker connection"
    assert "no partitions" in readiness(HealthSnapshot(loop_at=1, broker_connected=True, assigned=0)).reason


def test_the_server_answers_json_with_the_status_code():
    snap = [READY]
    server = HealthServer("127.0.0.1", 0, lambda: snap[0], 1e9)
    try:
        def get(path):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=5) as r:
                    return r.status, json.loads(r.read())
            except urllib.error.HTTPError as exc:
                return exc.code, (json.loads(exc.read()) if exc.code != 404 else None)

        status, body = get("/readyz")
        assert (status, body["ok"], body["reason"], body["broker_connected"]) == (200, True, "ready", True)
        snap[0] = HealthSnapshot(loop_at=READY.loop_at, store_error="gone", broker_connected=True, assigned=2)
        status, body = get("/readyz")
        assert status == 503 and body["store_error"] == "gone" and body["assigned"] == 2
        assert get("/healthz")[0] == 200
        assert get("/nope")[0] == 404
    finally:
        server.close()
