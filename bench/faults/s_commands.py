"""Attacks on the command path: forged commands, a controller killed mid-incident, the trainer
host's keys, and a trainer paused by a controller that never comes back."""

from __future__ import annotations

import dataclasses
import re
import signal
import subprocess
import sys
import time

from kafka import KafkaProducer

from bench.faults.harness import (
    REPO,
    SECRET,
    ControllerProc,
    Ctx,
    FakeTrainer,
    Measured,
    ScenarioFailed,
    TinyTraining,
    child_env,
    commands_of,
    fresh_kafka,
    incidents_of,
    store,
    wait_until,
)
from bench.faults.registry import scenario
from cliffguard.core.events import Command, encode_command, make_command
from cliffguard.core.signing import Secret, sign_command
from testing.controller_service import prefix, spike


def _forgeries(run: str, key) -> dict[str, list[Command]]:
    """18 commands a trainer must refuse (3 of each kind) signed or mangled as an attacker could."""
    other = Secret("not-the-deployment-secret-0000")
    out: dict[str, list[Command]] = {k: [] for k in ("wrong_key", "tampered", "expired", "wrong_run", "unsigned",
                                                     "replayed")}
    for ctype in ("pause", "stop", "set_lr_scale"):
        args = {"lr_scale": 100.0} if ctype == "set_lr_scale" else {}
        out["wrong_key"].append(sign_command(make_command(ctype, run, args), other))
        signed = sign_command(make_command("set_lr_scale", run, {"lr_scale": 0.5}), key)
        out["tampered"].append(dataclasses.replace(signed, args={"lr_scale": 1000.0}))
        out["expired"].append(sign_command(make_command(ctype, run, args, ttl_s=5, now=time.time() - 60), key))
        out["wrong_run"].append(sign_command(make_command(ctype, "another-run", args), key))
        out["unsigned"].append(make_command(ctype, run, args))
    return out


@scenario("a_forged_commands_refused", "held: forged, tampered, expired, wrong-run, unsigned and replayed commands",
          timeout_s=90, smoke=True)
def forged_commands(ctx: Ctx) -> Measured:
    m = Measured()
    kafka = fresh_kafka(ctx.bootstrap)
    run = "victim"
    tr = TinyTraining(run, kafka, ctx.tmp / "spill", secret=SECRET)
    producer = KafkaProducer(**kafka.client_kwargs(), linger_ms=0)
    try:
        good = sign_command(make_command("set_lr_scale", run, {"lr_scale": 0.5}), SECRET)
        bad = _forgeries(run, SECRET)
        bad["replayed"] = [good, good, good]
        sends = [c for kind in ("wrong_key", "tampered", "expired", "wrong_run", "unsigned") for c in bad[kind]]
        for cmd in [good, *sends, *bad["replayed"]]:
            producer.send(kafka.commands_topic, key=run.encode(), value=encode_command(cmd))
        producer.flush()
        m.commands_sent, m.forged_sent = 1, len(sends) + len(bad["replayed"])
        applied: list[Command] = []
        refusals_before = tr.agent.commands.received if tr.agent.commands else 0
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:  # the loop: a step, then the commands at its boundary
            tr.step()
            applied += tr.agent.poll_commands()
            if tr.agent.commands and tr.agent.commands.received - refusals_before >= 1 + m.forged_sent:
                for _ in range(5):  # what arrived by now is at the boundary within a few steps
                    tr.step()
                    applied += tr.agent.poll_commands()
                break
        m.check(tr.agent.commands is not None and tr.agent.commands.received >= 1 + m.forged_sent,
                "not every command reached the listener")
        m.commands_obeyed = sum(c.id == good.id for c in applied)
        m.duplicate_commands = max(0, m.commands_obeyed - 1)
        m.forged_obeyed = sum(c.id != good.id for c in applied) + m.duplicate_commands
        m.check(m.commands_obeyed == 1, f"the genuine command was applied {m.commands_obeyed} times")
        m.note(f"{m.forged_sent} forged/replayed refused: 3 each of {', '.join(bad)}")
    finally:
        producer.close()
        tr.close()
    return m


@scenario("a_controller_sigkill_mid_incident", "held: controller SIGKILLed mid-incident; no command twice, one rollback",
          timeout_s=180, postgres=True)
def controller_sigkill(ctx: Ctx) -> Measured:
    m = Measured()
    kafka = fresh_kafka(ctx.bootstrap)
    with store(ctx, "postgres") as (engine, url):
        t = FakeTrainer(kafka)
        first = ControllerProc(kafka, url, ctx.path("controller.log")).start()
        second = None
        try:
            run = "killed"
            prefix(t, run)
            spike(t, run, 41)
            pause = t.expect(run, "pause", 60)
            first.kill(signal.SIGKILL)
            t.ack(pause)  # waits in Kafka while no controller runs
            t0 = time.monotonic()
            second = ControllerProc(kafka, url, ctx.path("controller.log"), group=first.group).start()
            val = t.expect(run, "validate", 60)
            m.recover_s = time.monotonic() - t0
            t.ack(val)
            t.validation(run, 43, 3.0, cmd=val)
            rb = t.expect(run, "rollback", 60)
            second.kill(signal.SIGKILL)  # and once more, between the rollback and its ack
            t.ack(rb)
            t.steps(run, 21, 30)
            third = ControllerProc(kafka, url, ctx.path("controller.log"), group=first.group).start()
            try:
                wait_until(lambda: (incidents_of(engine, run) or [None])[0] is not None
                           and incidents_of(engine, run)[0].outcome != "open", 60, "the incident closed")
                t.quiet(1.0)
            finally:
                if third.crashed:
                    m.crashes += 1
                third.stop()
            types = t.types(run)
            m.commands_obeyed = len(types)
            m.commands_sent = len(commands_of(engine, run))
            m.duplicate_commands = len(types) - len(set(types))
            m.rollbacks = types.count("rollback")
            m.check(types == ["pause", "validate", "rollback"], f"the trainer obeyed {types}")
            incs = incidents_of(engine, run)
            m.check(len(incs) == 1 and incs[0].outcome == "rolled_back", f"incidents {[i.outcome for i in incs]}")
            m.note(f"2 SIGKILLs; {len(t.duplicates)} re-sent copies refused by id; PostgreSQL")
        finally:
            t.close()
            for ctl in (first, second):
                if ctl is not None:
                    if ctl.crashed:
                        m.crashes += 1
                    ctl.stop()
    return m


@scenario("k_trainer_host_cannot_forge", "keys: a trainer host (public key, HMAC secret) cannot sign a command",
          timeout_s=90)
def trainer_host_cannot_forge(ctx: Ctx) -> Measured:
    from cliffguard.agent.listener import CommandListener
    from cliffguard.core.keys import CommandPrivateKey
    from cliffguard.core.signing import CommandVerifier

    m = Measured()
    kafka = fresh_kafka(ctx.bootstrap)
    run = "keyed"
    private = CommandPrivateKey.generate()
    public = private.public_key()
    listener = CommandListener(kafka, run, CommandVerifier(run, public), lambda *a: None).start()
    producer = KafkaProducer(**kafka.client_kwargs(), linger_ms=0)
    try:
        good = sign_command(make_command("pause", run), private)
        forged = [sign_command(make_command("stop", run), SECRET),  # the old shared HMAC secret
                  sign_command(make_command("stop", run), Secret(public.raw())),  # the public key as a secret
                  sign_command(make_command("stop", run), CommandPrivateKey.generate()),  # a key of its own
                  dataclasses.replace(good, args={"reason": "tampered"})]
        for cmd in [good, *forged]:
            producer.send(kafka.commands_topic, key=run.encode(), value=encode_command(cmd))
        producer.flush()
        m.commands_sent, m.forged_sent = 1, len(forged)
        got: list[Command] = []
        wait_until(lambda: (got.extend(listener.poll()) or listener.received >= 1 + len(forged)), 30,
                   "every command at the listener")
        got += listener.poll()
        m.commands_obeyed = sum(c.id == good.id for c in got)
        m.forged_obeyed = sum(c.id != good.id for c in got)
        m.check(m.commands_obeyed == 1, "the controller-signed command was refused")
        m.note(f"{len(forged) - m.forged_obeyed} of {len(forged)} forgeries refused (HMAC secret, public key as "
               f"secret, own key, tampered args)")
    finally:
        producer.close()
        listener.close()
    return m


@scenario("h09_controller_pause_times_out", "9: a controller-initiated pause never timed out on the trainer side",
          timeout_s=300)
def pause_times_out(ctx: Ctx) -> Measured:
    m = Measured()
    kafka = fresh_kafka(ctx.bootstrap)
    run = "paused"
    with store(ctx) as (engine, url):
        ctl = ControllerProc(kafka, url, ctx.path("controller.log")).start()
        env = child_env({"CLIFFGUARD_AGENT__RECOVERY__PAUSE_TIMEOUT_S": "5",
                         "CLIFFGUARD_AGENT__RECOVERY__ON_PAUSE_TIMEOUT": "resume"})
        train_log = ctx.path("train.log")
        steps = 150
        with train_log.open("wb") as fh:
            trainer = subprocess.Popen(
                [sys.executable, "-m", "cliffguard.cli", "train", "--nproc", "1", "--run", run, "--steps", str(steps),
                 "--bootstrap", kafka.bootstrap, "--topic-prefix", kafka.topic_prefix, "--out-dir", str(ctx.tmp / "runs"),
                 "--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--seq-len", "32", "--val-every", "0",
                 "--progress-every", "10"], env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=str(REPO),
                start_new_session=True)
        try:
            wait_until(lambda: any(s >= 20 for s in _steps(engine, run)), 120, "the trainer at step 20")
            subprocess.run([sys.executable, "-m", "cliffguard.cli", "command", run, "pause", "--db", url, "--no-wait"],
                           env=child_env(), check=True, capture_output=True, cwd=str(REPO))
            m.commands_sent = 1
            wait_until(lambda: any(c.type == "pause" and c.status == "applied" for c in commands_of(engine, run)),
                       60, "the pause applied")
            m.commands_obeyed = 1
            acked = [c.ack_detail or "" for c in commands_of(engine, run) if c.type == "pause"]
            said = re.search(r"step (\d+)", acked[-1]) if acked else None  # "paused at step N"
            paused_at = int(said.group(1)) if said else max(_steps(engine, run))
            ctl.kill(signal.SIGKILL)  # the controller never answers the pause
            t0 = time.monotonic()
            try:  # the trainer's own progress lines: training again past where it was paused
                wait_until(lambda: _progress(train_log) >= paused_at + 10, 90, "training resumed")
            except ScenarioFailed:
                raise ScenarioFailed("the trainer stayed paused 90 s after the controller went away") from None
            m.recover_s = time.monotonic() - t0
            m.check(m.recover_s < 45, f"resumed after {m.recover_s:.0f}s (timeout 5 s)")
            trainer.wait(240)
            m.check(trainer.returncode == 0, f"trainer exit code {trainer.returncode}")
            m.note(f"paused at step ~{paused_at}, controller SIGKILLed; training again after {m.recover_s:.1f}s "
                   f"(pause_timeout_s 5), run finished")
        finally:
            if trainer.poll() is None:
                trainer.kill()
            if ctl.crashed:
                m.crashes += 1
            ctl.stop()
    return m


def _progress(log_path) -> int:
    """The newest step of the trainer's progress lines (``step   110/150 ...``), or -1."""
    found = re.findall(r"^step\s+(\d+)/", log_path.read_text(errors="replace"), flags=re.M)
    return int(found[-1]) if found else -1


def _steps(engine, run: str) -> set[int]:
    from bench.faults.harness import steps_stored

    return steps_stored(engine, run)
