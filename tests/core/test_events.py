"""The event/command contract: round trips, non-finite floats, versions, and hostile input."""

from __future__ import annotations

import json
import math

import pytest

from cliffguard.core.enums import AckStatus, CheckpointKind, CommandType, EventType, GuardDecision
from cliffguard.core.events import (
    COMMAND_ARG_SCHEMAS,
    DATA_SCHEMAS,
    MAX_STEP,
    MAX_WORLD,
    SCHEMA_VERSION,
    SchemaError,
    UnknownVersion,
    check_run_id,
    decode_command,
    decode_event,
    encode_command,
    encode_event,
    make_command,
    make_event,
)
from cliffguard.core.floats import dumps

HIST_LAYER = {"counts": [1, 2, 3], "zeros": 4, "nonfinite": 0, "p50": 1e-4, "p99": 0.01, "max": 0.5,
              "norm": 1.5, "underflow": 0.0, "numel": 10}

STEP = {
    "loss": 2.5, "loss_local": 2.4, "lr": 3e-4, "lr_scale": 1.0, "grad_norm": 0.9, "tokens": 4096,
    "step_time_s": 0.05, "data_wait_s": 0.001, "comm_exposed_s": 0.002, "compute_s": 0.04,
    "tokens_per_s": 81920.0, "mfu": 0.41, "mem_allocated": 1 << 20, "mem_reserved": 2 << 20,
    "loss_scale": 65536.0, "skipped": False, "clipped_layers": 0, "guard": "ok",
    "layer_grad_norms": {"h.0.attn": 0.1}, "sample_range": [0, 32],
}

# One valid payload per event type: every member of the closed vocabulary must appear here.
PAYLOADS: dict[EventType, dict] = {
    EventType.RUN_STARTED: {"n_params": 1000, "n_layers": 2, "n_heads": 2, "head_dim": 16, "seq_len": 64,
                            "global_batch": 8, "peak_flops": 1e12, "peak_source": "table",
                            "lr_schedule": {"kind": "cosine", "warmup": 10}, "world_size": 2,
                            "config": {"a": 1}},
    EventType.STEP: STEP,
    EventType.GRAD_HIST: {"edges": [2.0 ** -k for k in range(4)], "layers": {"h.0": HIST_LAYER}},
    EventType.HEARTBEAT: {"state": "running"},
    EventType.CHECKPOINT: {"kind": "full", "path": "/tmp/c", "bytes": 10, "sha256": "ab" * 32,
                           "seconds": 0.5, "verified": True, "detail": ""},
    EventType.VALIDATION: {"cmd": "c" * 32, "val_loss": 2.1, "batches": 4},
    EventType.COMMAND_ACK: {"cmd": "c" * 32, "cmd_type": "pause", "status": "applied", "detail": "ok"},
    EventType.DATA_FLAG: {"sample_ids": [1, 2, 3], "rule": "garbled", "score": 0.9},
    EventType.DATA_STATS: {"first_step": 10, "batches": 2, "sequences": 16, "tokens": 1000, "pad_share": 0.02,
                           "len_counts": [0] * 7 + [16] + [0] * 9, "sketch": [3, 0, 997], "dup_share": 0.0625,
                           "dup_in_batch": 0.0, "steps": [10, 11], "step_dup": [0.0, 0.125], "step_pad": [0.0, 0.04],
                           "step_garbled": [0.0, 0.0], "step_ppl": [1.7, 1.8], "garbled": 0.0,
                           "outlier_steps": [11], "outlier_ids": [4242], "outlier_reasons": ["duplicate"],
                           "outlier_scores": [0.9375], "dropped": 1},
    EventType.RUN_FINISHED: {"final_loss": 1.9, "steps": 100},
    EventType.RUN_FAILED: {"error": "boom"},
    EventType.RANKS: {"first_rank": 0, "steps": 10, "step_time_s": [0.05], "data_wait_s": [0.001],
                      "comm_exposed_s": [0.002], "mfu": [0.4], "tokens_per_s": [8e4], "mem_allocated": [1 << 20],
                      "mem_reserved": [2 << 20], "loss_local": [2.4]},
    EventType.ELASTIC_SCALED_DOWN: {"from_world": 4, "to_world": 2, "from_global_batch": 16, "global_batch": 8,
                                    "grad_accum": 1, "lr": 2e-3, "lr_factor": 0.7071, "steps_lost": 3,
                                    "seconds_lost": 12.5, "backoff_s": 0.0, "policy": "proportional", "lr_rule": "sqrt"},
    EventType.ELASTIC_SCALED_UP: {"from_world": 2, "to_world": 4, "from_global_batch": 8, "global_batch": 16,
                                  "grad_accum": 1, "lr": 2e-3, "lr_factor": 1.0, "steps_lost": 0,
                                  "seconds_lost": 20.0, "backoff_s": 0.0, "policy": "proportional", "lr_rule": "sqrt"},
    EventType.HANG_EVIDENCE: {"reason": "stalled", "stalled_s": 8.5, "node": "node-a", "pid": 4242, "life": 0,
                              "collective": "all_reduce", "fr": True,
                              "pg_status": {"0": {"enqueued": 41, "started": -1, "completed": 40}},
                              "in_flight": [{"pg": "0", "seq": 41, "op": "gloo:all_reduce", "sizes": [[4]], "age_s": 8.4}],
                              "last": [], "frame": "/repo/agent/step_probe.py:181 in before_optimizer_step",
                              "stacks": [{"name": "MainThread", "main": True, "frame": "x.py:1 in f",
                                          "frames": ["x.py:1 in f"]}]},
    EventType.NODE_CHECK: {"ok": False, "life": 1, "ranks": [0, 1, 2, 3], "nodes": ["a", "a", "b", "b"],
                           "matmul_s": [0.01, 0.01, 0.5, 0.01],
                           "rounds": [{"groups": [[0, 1], [2, 3]], "seconds": [0.02, 0.51], "slow": [1]}],
                           "slow": [2], "slow_nodes": ["b"], "seconds": 1.2, "detail": "slow in every pair: ranks [2]"},
    EventType.TRAINER_TIMEOUT: {"wait": "hold", "policy": "rollback", "waited_s": 120.0, "at_step": 125,
                                "applied": True, "lr_scale_before": 1.0, "lr_scale": 0.5,
                                "detail": "restored step 120 from memory", "first_bad_step": 120, "to_step": 120},
    EventType.RUN_PREEMPTED: {"signal": "SIGTERM", "deadline_s": 30.0, "save_s": 2.5, "margin_s": 27.5,
                              "verified": True, "wait_s": 0.2, "exit_code": 75, "path": "/ckpt/full-00000040",
                              "detail": "full checkpoint of step 40 verified"},
    EventType.STEP_TRIAGED: {"class": "data", "remedy": "skip_batch", "rank": 2, "reason": "rank 2's shard is bad on rank 3 too",
                             "reruns": 2, "rerun_s": 0.12, "evidence": {"same": {"loss": [2.0, 2.0, 9.0, 2.0]}},
                             "sample_ids": [40, 41], "update_applied": False, "bad_batches": 1, "transient_counts": {}},
}

ARGS: dict[CommandType, dict] = {
    CommandType.PAUSE: {"reason": "spike"},
    CommandType.RESUME: {},
    CommandType.VALIDATE: {"batches": 8},
    CommandType.ROLLBACK: {"to_step": 100, "lr_scale": 0.5, "skip_data": [3200, 3264]},
    CommandType.SET_LR_SCALE: {"lr_scale": 0.25},
    CommandType.CHECKPOINT_NOW: {"kind": "incremental"},
    CommandType.STOP: {"reason": "operator"},
    CommandType.DETAIL: {"steps": 20},
    CommandType.RESTART: {"mode": "exclude", "life": 1, "ranks": [2], "exclude_nodes": ["node-b"],
                          "reason": "rank 2 hung again", "incident": "abc"},
}


def test_fixtures_cover_every_type():
    assert set(PAYLOADS) == set(EventType) == set(DATA_SCHEMAS)
    assert set(ARGS) == set(CommandType) == set(COMMAND_ARG_SCHEMAS)


@pytest.mark.parametrize("etype", list(EventType))
def test_every_event_type_round_trips(etype):
    ev = make_event(etype, "run-1", 7, PAYLOADS[etype], rank=1, world=2, ts=1700000000.25)
    back = decode_event(encode_event(ev))
    assert back == ev
    assert back.type is etype and back.rank == 1 and back.world == 2 and back.step == 7


@pytest.mark.parametrize("ctype", list(CommandType))
def test_every_command_type_round_trips(ctype):
    cmd = make_command(ctype, "run-1", ARGS[ctype], ttl_s=30, now=1000.0)
    back = decode_command(encode_command(cmd))
    assert back == cmd
    assert back.expires_at == 1030.0


def test_enums_are_typed_after_decoding():
    step = decode_event(encode_event(make_event("step", "r", 1, {**STEP, "guard": "skip"})))
    assert step.data["guard"] is GuardDecision.SKIP
    ck = decode_event(encode_event(make_event("checkpoint", "r", 1, PAYLOADS[EventType.CHECKPOINT])))
    assert ck.data["kind"] is CheckpointKind.FULL
    ack = decode_event(encode_event(make_event("command.ack", "r", 1, PAYLOADS[EventType.COMMAND_ACK])))
    assert ack.data["status"] is AckStatus.APPLIED


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_floats_survive_as_strict_json(value):
    data = {**STEP, "loss": value, "grad_norm": value, "layer_grad_norms": {"h.0": value}}
    raw = encode_event(make_event("step", "r", 3, data))
    json.loads(raw, parse_constant=lambda c: pytest.fail(f"bare {c} in output"))  # strict JSON
    back = decode_event(raw)
    for got in (back.data["loss"], back.data["grad_norm"], back.data["layer_grad_norms"]["h.0"]):
        assert (math.isnan(got) and math.isnan(value)) or got == value


def test_non_finite_in_histograms_and_command_args():
    layer = {**HIST_LAYER, "max": math.inf, "norm": math.nan}
    back = decode_event(encode_event(make_event("grad_hist", "r", 1, {"edges": [1.0, math.inf], "layers": {"x": layer}})))
    assert back.data["edges"][1] == math.inf and math.isnan(back.data["layers"]["x"]["norm"])
    cmd = decode_command(encode_command(make_command("set_lr_scale", "r", {"lr_scale": math.inf})))
    assert cmd.args["lr_scale"] == math.inf


def test_unknown_fields_from_a_newer_minor_are_tolerated():
    obj = make_event("heartbeat", "r", 1, {"state": "running"}).to_dict()
    obj["new_envelope_field"] = {"x": 1}
    obj["data"]["new_data_field"] = [1, 2]
    ev = decode_event(json.dumps(obj).encode())
    assert ev.data["state"] == "running"
    assert ev.data["new_data_field"] == [1, 2]


def test_unknown_major_version_is_rejected():
    obj = make_event("heartbeat", "r", 1, {"state": "running"}).to_dict()
    obj["v"] = SCHEMA_VERSION + 1
    with pytest.raises(UnknownVersion) as err:
        decode_event(json.dumps(obj))
    assert err.value.field == "v" and "unknown major" in err.value.reason
    cmd = make_command("pause", "r").to_dict()
    cmd["v"] = 99
    with pytest.raises(UnknownVersion):
        decode_command(json.dumps(cmd))


def _event(**over):
    obj = make_event("step", "run-1", 5, STEP).to_dict()
    obj.update(over)
    return obj


def _reject(raw, field):
    with pytest.raises(SchemaError) as err:
        decode_event(raw, max_bytes=1_000_000)
    assert err.value.field == field, err.value
    return err.value


def test_truncated_json_is_rejected_at_the_root():
    raw = encode_event(make_event("step", "r", 1, STEP))
    err = _reject(raw[: len(raw) // 2], "$")
    assert "invalid JSON" in err.reason


@pytest.mark.parametrize(("field", "value", "where"), [
    ("step", "5", "step"),
    ("step", -1, "step"),
    ("step", True, "step"),
    ("step", 2**63, "step"),
    ("step", MAX_STEP + 1, "step"),
    ("world", MAX_WORLD + 1, "world"),
    ("world", 0, "world"),
    ("rank", 1.5, "rank"),
    ("rank", 3, "rank"),
    ("ts", "yesterday", "ts"),
    ("ts", "NaN", "ts"),
    ("type", "no.such.type", "type"),
    ("data", [1, 2], "data"),
    ("v", "1", "v"),
])
def test_wrong_types_name_the_field(field, value, where):
    _reject(json.dumps(_event(**{field: value})), where)


@pytest.mark.parametrize(("name", "value"), [("loss", "high"), ("tokens", 1.5), ("skipped", 0),
                                            ("guard", "maybe"), ("layer_grad_norms", {"a": "x"})])
def test_wrong_data_types_name_the_data_field(name, value):
    err = _reject(json.dumps(_event(data={**STEP, name: value})), f"data.{name}" if name != "layer_grad_norms" else "data.layer_grad_norms.a")
    assert err.reason


def test_missing_required_data_field():
    data = dict(STEP)
    del data["loss"]
    err = _reject(json.dumps(_event(data=data)), "data.loss")
    assert err.reason == "missing"


@pytest.mark.parametrize("field", ["id", "run"])
@pytest.mark.parametrize("bad", ["NaN", "Infinity", None, 5, "", "x" * 300, "../../etc"])
def test_nan_and_garbage_in_ids_are_rejected(field, bad):
    _reject(json.dumps(_event(**{field: bad})), field)


def test_bare_nan_literal_is_not_json():
    raw = json.dumps(_event(), separators=(",", ":")).replace('"loss":2.5', '"loss":NaN')
    assert '"loss":NaN' in raw
    err = _reject(raw, "$")
    assert "NaN" in err.reason


def test_ten_megabyte_payload_is_rejected_by_size_before_parsing():
    obj = _event(data={**STEP, "padding": "x" * (10 * 1024 * 1024)})
    raw = json.dumps(obj).encode()
    err = _reject(raw, "$")
    assert "exceeds the limit" in err.reason and str(len(raw)) in err.reason
    with pytest.raises(SchemaError, match="exceeds"):
        decode_command(raw, max_bytes=64 * 1024)


def test_non_utf8_is_rejected():
    err = _reject(b'{"v":1,"id":"\xff\xfe"}', "$")
    assert "UTF-8" in err.reason


def test_deep_nesting_is_rejected_not_crashing():
    raw = "[" * 100_000 + "]" * 100_000
    err = _reject(raw, "$")
    assert "deep" in err.reason or "JSON" in err.reason
    deep_data = '{"v":1,"data":' + '{"a":' * 50_000 + "1" + "}" * 50_001
    _reject(deep_data, "$")


def test_not_an_object_is_rejected():
    for raw in ("[]", "1", '"s"', "null"):
        _reject(raw, "$")


def test_command_validation_names_the_field():
    good = make_command("rollback", "r", ARGS[CommandType.ROLLBACK]).to_dict()
    for over, field in [({"type": "reboot"}, "type"), ({"args": {"lr_scale": 0.5}}, "args.to_step"),
                        ({"expires_at": "soon"}, "expires_at"), ({"sig": 5}, "sig"), ({"id": "NaN"}, "id")]:
        with pytest.raises(SchemaError) as err:
            decode_command(json.dumps({**good, **over}))
        assert err.value.field == field


def test_a_step_beyond_the_store_columns_never_decodes():
    assert decode_event(json.dumps(_event(step=MAX_STEP))).step == MAX_STEP
    good = make_command("rollback", "r", ARGS[CommandType.ROLLBACK]).to_dict()
    for to_step in (MAX_STEP + 1, 2**63):
        with pytest.raises(SchemaError) as err:
            decode_command(json.dumps({**good, "args": {**good["args"], "to_step": to_step}}))
        assert err.value.field == "args.to_step"


def test_make_event_validates_before_sending():
    with pytest.raises(SchemaError) as err:
        make_event("step", "r", 1, {"loss": 1.0})
    assert err.value.field.startswith("data.")
    with pytest.raises(ValueError):
        make_event("no-such-type", "r", 1, {})


def test_dumps_is_compact_utf8():
    raw = dumps({"a": "é", "b": math.nan})
    assert raw == '{"a":"é","b":"NaN"}'.encode()


def test_check_run_id_is_the_envelope_rule():
    check_run_id("team-a.run_7:x")
    for bad in ["team a/run 7", "", "NaN", 7]:
        with pytest.raises(SchemaError, match="^run: "):
            check_run_id(bad)
        _reject(json.dumps(_event(run=bad)), "run")


def _outcome(raw):
    """What ``decode_event`` makes of ``raw``: the event (as wire JSON, so NaN compares equal) or
    the error's type, field and reason."""
    try:
        return ("ok", dumps(decode_event(raw).to_dict()))
    except SchemaError as exc:
        return (type(exc).__name__, exc.field, exc.reason)


def _hostile_messages() -> list[bytes]:
    good = json.dumps(_event(), separators=(",", ":"))
    out = [good.encode(), encode_event(make_event("step", "run-1", 5, {**STEP, "loss": math.nan}))]
    for name, bad in [("loss", "NaN"), ("loss", "Infinity"), ("tokens", 2**70), ("tokens", 2**64), ("tokens", 2**63),
                      ("tokens", -(2**64)), ("extra", 2**70), ("extra", -(2**63) - 1), ("tokens", -(2**63) - 1), ("sample_range", [0, 2**70]), ("loss", 10**400),
                      ("guard", "ok "), ("skipped", 1), ("tokens", 4096.0), ("lr", 1), ("loss", "\ud800")]:
        out.append(json.dumps(_event(data={**STEP, name: bad})).encode())
    for field, bad in [("step", 2**70), ("step", 12345678901234567890), ("ts", 10**25), ("rank", -0),
                       ("world", 2**64), ("run", "r" * 20), ("id", "1" * 32)]:
        out.append(json.dumps(_event(**{field: bad})).encode())
    out += [
        good.replace('"loss":2.5', '"loss":NaN').encode(),
        good.replace('"loss":2.5', '"loss":-Infinity').encode(),
        good.replace('"loss":2.5', '"loss":1e400').encode(),
        good.replace('"loss":2.5', '"loss":2.5,"loss":3.5').encode(),  # a repeated key: the last one counts
        good.replace('"run-1"', '"run\u002d1"').encode(),
        good.replace('"ok"', '"\\ud800"').encode(),
        b"\xef\xbb\xbf" + good.encode(),  # a byte order mark
        good.encode() + b"x",
        good.encode() + b"\x00",
        good.encode()[:-1],
        good.encode().replace(b"run-1", b"run-\xff"),
        b"[" * 5000 + b"]" * 5000,
        b'{"v":1,"data":' + b'{"a":' * 5000 + b"1" + b"}" * 5001,
        b"", b"null", b"[]", b"1",
    ]
    return out


def test_bytes_decode_exactly_as_the_standard_parser_reads_them(monkeypatch):
    """The fast path (orjson when installed) accepts, normalises and rejects every message as
    the standard parser does, with the same reason: hostile messages still reach the DLQ as
    before (tests/core/test_batch_decode.py mutates many more, for msgspec's path too)."""
    import cliffguard.core.events as events

    messages = _hostile_messages()
    fast = [_outcome(m) for m in messages]
    monkeypatch.setattr(events, "_orjson_loads", None)
    assert fast == [_outcome(m) for m in messages]
    assert sum(o[0] == "ok" for o in fast) >= 5 and sum(o[0] != "ok" for o in fast) >= 20


def test_the_fast_parser_is_used_for_ordinary_messages_and_not_for_long_integers():
    import cliffguard.core.events as events

    pytest.importorskip("orjson")
    ordinary = dumps({**make_event("step", "run-1", 5, STEP).to_dict(), "id": "ab" * 16})  # a random id may
    assert events._fast_parse(ordinary) is not None  # hold 19 decimal digits in a row (~0.2 %): that one may not
    assert events._fast_parse(dumps(_event(data={**STEP, "extra": -(2**63) - 1}))) is None  # 19 digits
    assert events._fast_parse(json.dumps(_event(data={**STEP, "extra": 2**70})).encode()) is None
    assert events._fast_parse(ordinary.decode()) is None  # text goes to the standard parser
