"""Holes in what the controller believes: deep rollbacks, forged clocks, acks and metrics."""

from __future__ import annotations

import time

from bench.faults.harness import (
    Ctx,
    Measured,
    commands_of,
    controlled,
    dead_letters,
    incidents_of,
    raw_event,
    run_row,
    steps_stored,
    wait_until,
)
from bench.faults.registry import scenario
from testing.controller_service import healthy_loss, prefix, spike
from testing.controller_stack import step_data


@scenario("h03_deep_rollback_respike", "3: a rollback deeper than the MFU window, then a re-divergence",
          timeout_s=150)
def deep_rollback_respike(ctx: Ctx) -> Measured:
    m = Measured()
    env = {"CLIFFGUARD_RULES__MFU__WINDOW": "10"}
    with controlled(ctx, m, env=env) as lp:
        t, run = lp.trainer, "deep"
        prefix(t, run)
        spike(t, run, 41)
        t.ack(t.expect(run, "pause", 60))
        val = t.expect(run, "validate")
        t.ack(val)
        t.validation(run, 43, 3.0, cmd=val)
        rb = t.expect(run, "rollback")
        m.check(rb.args.get("to_step") == 20, f"rollback to {rb.args} (want 20: 23 steps back, window 10)")
        t.ack(rb, detail="memory")
        t.steps(run, 21, 35)
        onset = 36
        spike(t, run, onset)
        t.ack(t.expect(run, "pause", 60))
        incs = incidents_of(lp.engine, run)
        late = incs[-1].spike_step - onset if len(incs) == 2 else None
        m.check(late is not None and late <= 2, f"re-divergence at {onset} paused at {incs[-1].spike_step if incs else '-'}")
        t.quiet(1.0)  # the second incident's validate, if already sent, is counted as received
        m.events_produced = 44  # distinct steps 0..43 (21..38 were trained twice)
        m.events_stored = len(steps_stored(lp.engine, run) & set(range(44)))
        m.commands_sent = len(commands_of(lp.engine, run))
        m.commands_obeyed = len(t.received.get(run, []))
        m.rollbacks = sum(c.type == "rollback" for c in commands_of(lp.engine, run))
        m.note(f"re-divergence caught {late} step(s) after onset; {len(incs)} incidents")
    return m


@scenario("h11_forged_timestamp", "11: a forged ts of 1e300 froze the run's last step and masked silence",
          timeout_s=90, smoke=True)
def forged_timestamp(ctx: Ctx) -> Measured:
    m = Measured()
    with controlled(ctx, m) as lp:
        t, run = lp.trainer, "clock"
        t.steps(run, 0, 19)
        for ts in (1e300, time.time() + 86400.0, 1.0):
            t.send_raw(run, raw_event("step", run, 20, step_data(healthy_loss(20), 20), ts=ts))
            m.forged_sent += 1
        t.steps(run, 20, 39)
        m.events_produced = 40
        m.recover_s = wait_until(lambda: len(steps_stored(lp.engine, run)) >= 40, 60, "40 real steps stored")
        wait_until(lambda: dead_letters(lp.engine).get("clock_skew", 0) >= 3, 30, "3 forged timestamps dead-lettered")
        m.events_stored = len(steps_stored(lp.engine, run) & set(range(40)))
        row = run_row(lp.engine, run)
        m.check(row is not None and row.last_step == 39, f"last_step {row.last_step if row else None} (want 39)")
        frozen = row is not None and row.last_event_ts is not None and row.last_event_ts > time.time() + 60
        m.forged_obeyed = int(frozen)
        m.check(not frozen, f"last_event_ts {row.last_event_ts if row else None} is in the future")
        m.note(f"dead letters {dead_letters(lp.engine)}")
    return m


@scenario("h12_ack_from_other_run", "12: an ack from run B for run A's command", timeout_s=90)
def ack_from_other_run(ctx: Ctx) -> Measured:
    m = Measured()
    with controlled(ctx, m, env={"CLIFFGUARD_RECOVERY__COMMAND_TIMEOUT_S": "3"}) as lp:
        t = lp.trainer
        prefix(t, "run-a")
        t.steps("run-b", 0, 10)
        spike(t, "run-a", 41)
        pause = t.expect("run-a", "pause", 60)
        t.send("run-b", "command.ack", 0, {"cmd": pause.id, "cmd_type": "pause", "status": "applied", "detail": "B"})
        t.producer.flush()
        m.forged_sent = 1
        # run-a's pause must stay unanswered: it times out and is resent, never taken as applied
        t0 = time.monotonic()
        t.expect("run-a", "pause", 30)  # the resend after the timeout
        m.recover_s = time.monotonic() - t0
        rows = {c.id: c for c in commands_of(lp.engine, "run-a")}
        m.forged_obeyed = int(rows[pause.id].status == "applied")
        m.check(rows[pause.id].status == "timeout", f"run-a's pause is {rows[pause.id].status} (want timeout)")
        m.commands_sent = len(rows)
        m.commands_obeyed = len(t.received.get("run-a", []))
        m.check(t.types("run-a")[:2] == ["pause", "pause"], f"run-a got {t.types('run-a')}")
        m.note(f"run-a's pause {rows[pause.id].status}; resent after the timeout")
    return m


@scenario("k_forged_metrics_dlq", "11/keys: unsigned or badly signed metrics go to the DLQ, no incident",
          timeout_s=90)
def forged_metrics(ctx: Ctx) -> Measured:
    from cliffguard.core.events import encode_event, make_event
    from cliffguard.core.keys import EventSigner, event_key

    m = Measured()
    agent_secret = b"faults-agent-secret-faults-agent"
    with controlled(ctx, m, env={"CLIFFGUARD_AGENT_SECRET": agent_secret.decode()}) as lp:
        t, run = lp.trainer, "signed"
        signer = EventSigner(event_key(agent_secret, run))
        wrong = EventSigner(event_key(b"not-the-agent-secret-at-all-0000", run))

        def send(step: int, loss: float, by: EventSigner | None) -> None:
            value = encode_event(make_event("step", run, step, step_data(loss, step)))
            t.producer.send(lp.kafka.metrics_topic, key=run.encode(), value=value,
                            headers=by.headers(value) if by else None)

        for step in range(40):
            send(step, healthy_loss(step), signer)
        for step, by in ((40, None), (41, wrong), (42, None), (43, wrong), (44, None)):
            send(step, 1e6, by)  # the forged excursion that made the real trainer pause and validate
            m.forged_sent += 1
        for step in range(40, 60):
            send(step, healthy_loss(step), signer)
        t.producer.flush()
        m.events_produced = 60
        wait_until(lambda: len(steps_stored(lp.engine, run)) >= 60, 60, "60 signed steps stored")
        t.quiet(2.0)
        m.events_stored = len(steps_stored(lp.engine, run))
        m.forged_obeyed = len(incidents_of(lp.engine, run)) + len(t.received.get(run, []))
        m.check(m.forged_obeyed == 0, f"forged metrics opened {len(incidents_of(lp.engine, run))} incidents")
        m.check(sum(dead_letters(lp.engine).values()) >= 5, f"dead letters {dead_letters(lp.engine)}")
        m.note(f"5 forged 1e6 losses dead-lettered {dead_letters(lp.engine)}, no incident")
    return m


@scenario("k_step_jump_bounded", "keys: a step far ahead of the run's last step is refused (not its last step)",
          timeout_s=90)
def step_jump(ctx: Ctx) -> Measured:
    m = Measured()
    with controlled(ctx, m) as lp:
        t, run = lp.trainer, "jump"
        t.steps(run, 0, 29)
        t.send(run, "step", 2_000_000_000, step_data(healthy_loss(30), 30))
        m.forged_sent = 1
        t.steps(run, 30, 59)
        m.events_produced = 60
        wait_until(lambda: len(steps_stored(lp.engine, run) & set(range(60))) >= 60, 60, "60 real steps stored")
        m.events_stored = len(steps_stored(lp.engine, run) & set(range(60)))
        row = run_row(lp.engine, run)
        stored_far = max(steps_stored(lp.engine, run)) > 59
        m.forged_obeyed = int(stored_far or (row is not None and row.last_step > 59))
        m.check(m.forged_obeyed == 0, f"the far step was stored (last_step {row.last_step if row else None})")
        m.check(dead_letters(lp.engine).get("step_jump", 0) == 1, f"dead letters {dead_letters(lp.engine)}")
        m.note(f"step 2*10^9 after 29 dead-lettered; dead letters {dead_letters(lp.engine)}")
    return m
