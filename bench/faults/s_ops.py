"""Operations: secrets in artefacts, the health endpoint, oversized messages, the broker's child."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from bench.faults.harness import (
    REPO,
    SECRET,
    ControllerProc,
    Ctx,
    Measured,
    TinyTraining,
    child_env,
    controlled,
    dead_letters,
    fresh_kafka,
    steps_stored,
    wait_until,
)
from bench.faults.registry import scenario
from cliffguard.controller.broker import free_port, port_is_free
from cliffguard.procs import descendants
from testing.controller_service import prefix, spike


def _secret_forms() -> list[bytes]:
    raw = SECRET.reveal()
    return [raw, raw.hex().encode(), base64.b64encode(raw), base64.urlsafe_b64encode(raw)]


@scenario("a_no_secret_in_artefacts", "held: no secret in logs, stores, checkpoints or the spill", timeout_s=180)
def no_secret(ctx: Ctx) -> Measured:
    from bench.faults.s_checkpoints import _close, _train, _trainer

    m = Measured()
    os.environ["CLIFFGUARD_COMMAND_SECRET"] = SECRET.reveal().decode()  # as a deployment sets it
    with controlled(ctx, m) as lp:  # a controller that signs commands: pause, validate, resume
        t, run = lp.trainer, "secret"
        prefix(t, run)
        spike(t, run, 41)
        t.ack(t.expect(run, "pause", 60))
        val = t.expect(run, "validate")
        t.ack(val)
        t.validation(run, 43, 2.01, cmd=val)
        t.ack(t.expect(run, "resume"))
        tr = TinyTraining("secret-agent", lp.kafka, ctx.tmp / "spill", secret=SECRET)
        try:
            for _ in range(10):
                tr.step()
            tr.outage.down = True  # the rest goes to the spill file and stays there
            for _ in range(20):
                tr.step()
        finally:
            tr.close()
        trainer = _trainer(ctx.tmp, "secret-ckpt", ctx.tmp / "ckpt")
        try:
            _train(trainer, 21)
        finally:
            _close(trainer)
    files = [p for p in ctx.tmp.rglob("*") if p.is_file() and not p.is_symlink()]
    leaks = [str(p.relative_to(ctx.tmp)) for p in files if any(f in p.read_bytes() for f in _secret_forms())]
    m.check(len(files) >= 7, f"only {len(files)} artefacts written")
    m.check(not leaks, f"the secret is in {leaks}")
    m.note(f"{len(leaks)} of {len(files)} artefacts hold the secret (logs, SQLite store + WAL, spill, checkpoints)")
    return m


def _http(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


@scenario("s_health_endpoint", "store: liveness/readiness over HTTP; not ready once the store is gone",
          timeout_s=120)
def health(ctx: Ctx) -> Measured:
    import shutil

    m = Measured()
    port = free_port()
    kafka = fresh_kafka(ctx.bootstrap)
    root = ctx.tmp / "hstore"
    url = f"sqlite:///{root / 'store.db'}"
    ctl = ControllerProc(kafka, url, ctx.path("controller.log"),
                         env={"CLIFFGUARD_CONTROLLER__HEALTH_PORT": str(port)}).start()
    try:
        base = f"http://127.0.0.1:{port}"
        m.recover_s = wait_until(lambda: _http(base + "/readyz") == 200, 60, "ready")
        m.check(_http(base + "/healthz") == 200, "not live while consuming")
        shutil.rmtree(root)
        gone = wait_until(lambda: _http(base + "/readyz") != 200, 60, "not ready once the store is gone")
        m.note(f"ready after {m.recover_s:.1f}s; not ready {gone:.1f}s after the store directory was removed")
    finally:
        ctl.expected_exit = True  # the store was removed on purpose
        ctl.stop()
    return m


@scenario("s_oversized_message_dlq", "15: a message over ~3 MB never reached the DLQ", timeout_s=120)
def oversized(ctx: Ctx) -> Measured:
    from testing.controller_stack import step_bytes

    m = Measured()
    with controlled(ctx, m) as lp:
        run = "big"
        producer = KafkaProducer(**lp.kafka.client_kwargs(), max_request_size=16 * 1024 * 1024, linger_ms=0)
        try:
            producer.send(lp.kafka.metrics_topic, key=run.encode(), value=step_bytes(run, 0))
            producer.send(lp.kafka.metrics_topic, key=run.encode(), value=b"{" + b" " * (4 * 1024 * 1024) + b"}")
            for step in range(1, 20):
                producer.send(lp.kafka.metrics_topic, key=run.encode(), value=step_bytes(run, step))
            producer.flush()
        finally:
            producer.close()
        m.forged_sent, m.events_produced = 1, 20
        wait_until(lambda: len(steps_stored(lp.engine, run)) >= 20, 60, "the 20 steps around it")
        m.events_stored = len(steps_stored(lp.engine, run))
        consumer = KafkaConsumer(**lp.kafka.client_kwargs(), enable_auto_commit=False, auto_offset_reset="earliest")
        tp = TopicPartition(lp.kafka.dlq_topic, 0)
        consumer.assign([tp])
        seen: list[int] = []
        try:
            wait_until(lambda: seen.extend(len(r.value) for rs in consumer.poll(200).values() for r in rs) or seen,
                       30, "a DLQ record")
        finally:
            consumer.close()
        m.check(max(seen) < 1024 * 1024, f"DLQ record of {max(seen)} bytes (want truncated)")
        m.check(sum(dead_letters(lp.engine).values()) >= 1, f"dead letters {dead_letters(lp.engine)}")
        m.note(f"4 MiB message dead-lettered as a {max(seen)}-byte record; 20 of 20 steps around it stored")
    return m


@scenario("s_broker_child_dies_with_parent", "15: SIGKILL of `cliffguard broker` left the Tansu child on the port",
          timeout_s=90)
def broker_child(ctx: Ctx) -> Measured:
    m = Measured()
    port = free_port()
    argv = [sys.executable, "-m", "cliffguard.cli", "broker", "--port", str(port)]
    for attempt in range(2):  # the second start on the same port is the check that the first left nothing
        _start_and_kill(argv, port, m, attempt + 1)
    m.note(f"Tansu child gone and port free {m.recover_s:.1f}s after SIGKILL; restarted on the same port")
    return m


def _start_and_kill(argv: list[str], port: int, m: Measured, attempt: int) -> None:
    proc = subprocess.Popen(argv, env=child_env(), cwd=str(REPO), stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: not port_is_free("127.0.0.1", port) or proc.poll() is not None, 30, "the broker up")
        m.check(proc.poll() is None, f"start {attempt}: `cliffguard broker` exited {proc.returncode}")
        children = descendants(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        t0 = time.monotonic()
        wait_until(lambda: port_is_free("127.0.0.1", port) and not any(_alive(p) for p in children), 20,
                   "the Tansu child gone and the port free")
        m.recover_s = time.monotonic() - t0
    finally:
        for p in descendants(proc.pid):
            os.kill(p, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"

