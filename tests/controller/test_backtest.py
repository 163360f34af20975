"""Backtest (controller/backtest.py, cliffguard/commands/backtest.py): CSV reading with errors
naming the line, replay with the controller's defaults, the CLI (text, --json, options, config,
errors) and stored runs from a real SQLite and PostgreSQL store."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import uuid

import pytest

from cliffguard.cli import main
from cliffguard.controller import backtest as bt
from cliffguard.controller.detect import RulesConfig
from cliffguard.core.enums import EventType, Level
from cliffguard.core.events import make_event
from tests.controller.synthetic import base_curve, inject


def healthy(i: int) -> float:
    return 2.0 + 0.02 * ((i % 5) - 2)


MODERATE = 2.08
"""4σ over healthy() (σ at its floor, 1% of the median): each point warns; the third in a row
brings the evidence to the critical level (the seed calibration this early: ``core/spike.py``)."""


def spike_csv(tmp_path, name="loss.csv", spike_at=60, header="step,loss\n"):
    rows = [(s, MODERATE if spike_at <= s < spike_at + 5 else healthy(s)) for s in range(100)]
    path = tmp_path / name
    path.write_text(header + "".join(f"{s},{x}\n" for s, x in rows))
    return path


# -- CSV -------------------------------------------------------------------------------------


def test_csv_with_or_without_header_any_column_order_comments_and_nonfinite():
    assert bt.read_loss_csv("0,2.5\n1,2.4\n") == [(0, 2.5), (1, 2.4)]
    text = "# exported from W&B\n\nLoss,run,Step\n2.5,a,0\n\nnan,a,1\ninf,a,2\n"
    pts = bt.read_loss_csv(text)
    assert pts[0] == (0, 2.5) and math.isnan(pts[1][1]) and pts[2] == (2, math.inf)


@pytest.mark.parametrize(
    "text, line, words",
    [
        ("step,loss\n0,2.5\n1,abc\n", 3, "loss 'abc' is not a number"),
        ("step,loss\n0,2.5\n-1,2.4\n", 3, "step '-1' is not a non-negative integer"),
        ("0,2.5\n1.5,2.4\n", 2, "step '1.5'"),
        ("0,2.5\n7\n", 2, "expected at least 2 columns"),
        ("time,value\n0,2.5\n", 1, "header must name 'step' and 'loss'"),
        ("step,loss\n0,2.5\nstep,loss\n", 3, "step 'step'"),
        ("# nothing\n", 1, "no data rows"),
    ],
)
def test_bad_csv_names_the_line(text, line, words):
    with pytest.raises(bt.CsvError) as err:
        bt.read_loss_csv(text, "f.csv")
    assert err.value.line == line and words in str(err.value) and f"f.csv: line {line}:" in str(err.value)


def test_file_errors_are_csv_errors(tmp_path):
    with pytest.raises(bt.CsvError, match="no such file"):
        bt.read_loss_csv_file(tmp_path / "missing.csv")
    binary = tmp_path / "bin.csv"
    binary.write_bytes(b"step,loss\n0,2.5\n\xff\xfe,1\n")
    with pytest.raises(bt.CsvError, match="line 3: not UTF-8"):
        bt.read_loss_csv_file(binary)


# -- replay ----------------------------------------------------------------------------------


def test_replay_reports_warn_and_critical_with_the_onset_and_window_stats():
    events = bt.replay_points([(s, MODERATE if 60 <= s < 65 else healthy(s)) for s in range(100)])
    assert [(e.step, e.level, e.rule, e.onset_step) for e in events] == [
        (60, "warn", "loss_spike", 60), (62, "critical", "loss_spike", 60)]
    d = events[1].to_dict()
    assert d["action"] == "recover" and d["evidence"]["median"] == pytest.approx(2.0)
    json.dumps(d, allow_nan=False)


def test_replay_uses_the_given_config_and_json_survives_nonfinite():
    pts = [(s, healthy(s)) for s in range(40)] + [(40, math.nan)]
    (e,) = bt.replay_points(pts, RulesConfig())
    assert e.rule == "nonfinite" and e.level == "critical"
    assert json.loads(json.dumps(e.to_dict(), allow_nan=False))["evidence"]["loss"] == "NaN"
    assert bt.summary([e], 41) == {"points": 41, "warn": 0, "critical": 1, "first_critical_step": 40}


def test_a_critical_alert_that_does_not_pause_is_reported_as_warn():
    ev = [make_event(EventType.STEP, "r1", s, _step_data(healthy(s), grad_norm=1000.0 if s == 40 else 1.0))
          for s in range(41)]
    (e,) = bt.replay_events(ev)
    assert (e.rule, e.rule_level, e.level, e.action) == ("grad_norm", "critical", "warn", "alert")


def _critical_at(step: int, median: float, sigma: float) -> bt.BacktestEvent:
    return bt.BacktestEvent(step=step, level=Level.CRITICAL, rule="loss_spike", rule_level="critical",
                            action="recover", onset_step=step, rank=None, message="",
                            evidence={"median": median, "sigma": sigma})


@pytest.mark.parametrize("sigma, after, outcome", [
    # a noisy curve (σ 2.5% of the median, so its 3σ band is +7.5%): three ordinary points after a
    # one-batch outlier, their median +6%, are inside the band the rule calls healthy -> resume
    (0.025, [1.06, 1.0, 1.09], "resume"),
    # the same curve, two of the three points still above the band: the excursion persists
    (0.025, [1.08, 1.0, 1.09], "rollback"),
    # a smooth curve (σ 0.5%): the validation margin (+5%) decides, as it always did
    (0.005, [1.06, 1.0, 1.09], "rollback"),
    (0.005, [1.04, 1.0, 1.09], "resume"),
])
def test_the_validation_stand_in_rolls_back_only_when_the_excursion_persists_beyond_the_noise(
        sigma, after, outcome):
    points = [(0, 1.0), (1, 1.5)] + [(2 + i, x) for i, x in enumerate(after)]
    assert bt.outcomes(points, [_critical_at(1, 1.0, sigma)]) == [outcome]
    # the band is the replayed rule's k_warn: with none, the margin alone decides
    assert bt.outcomes(points, [_critical_at(1, 1.0, sigma)], band_sigmas=0.0) == [
        "rollback" if statistics.median(after) > 1.05 else "resume"]


# -- CLI -------------------------------------------------------------------------------------


def cli(capsys, *argv):
    rc = main(["backtest", *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_text_lists_the_steps_with_window_stats(tmp_path, capsys):
    rc, out, _ = cli(capsys, spike_csv(tmp_path))
    assert rc == 0
    lines = out.splitlines()
    assert "100 points, 1 warn, 1 critical" in lines[0]
    assert lines[2].split()[:4] == ["step", "62", "critical", "loss_spike"]
    assert "(onset 60)" in lines[2] and "median 2" in lines[2]


def test_cli_text_without_window_stats_yet(tmp_path, capsys):
    path = tmp_path / "early.csv"
    path.write_text("0,2.0\n1,nan\n")
    rc, out, _ = cli(capsys, path)
    line = out.splitlines()[1]
    assert rc == 0 and "critical" in line and "nonfinite" in line and "median" not in line


def test_cli_json_is_one_object_with_typed_events(tmp_path, capsys):
    rc, out, _ = cli(capsys, spike_csv(tmp_path), "--json")
    assert rc == 0
    doc = json.loads(out)
    assert [(e["step"], e["level"]) for e in doc["events"]] == [(60, "warn"), (62, "critical")]
    assert all(isinstance(e["step"], int) and e["level"] in ("warn", "critical") for e in doc["events"])
    assert doc["points"] == 100 and doc["config"]["spike"]["budget"] == 1.0  # the controller's default


def test_cli_options_override_the_controller_defaults(tmp_path, capsys):
    path = spike_csv(tmp_path)
    _, out, _ = cli(capsys, path, "--json", "--k-crit", "4")  # 4σ stands for the budget now: two points
    assert [(e["step"], e["level"]) for e in json.loads(out)["events"]] == [(60, "warn"), (61, "critical")]
    _, out, _ = cli(capsys, path, "--json", "--k-warn", "500", "--k-crit", "1000")
    assert json.loads(out)["events"] == []
    _, out, _ = cli(capsys, path, "--json", "--no-divergence", "--divergence-method", "runmin",
                    "--cusum-drift", "1", "--divergence-threshold", "5", "--divergence-grace-steps", "0",
                    "--window", "50", "--min-history", "10", "--sigma-floor-rel", "0.02")
    cfg = json.loads(out)["config"]
    assert cfg["divergence"] == {**cfg["divergence"], "enabled": False, "method": "runmin", "drift": 1.0,
                                 "threshold": 5.0, "grace_steps": 0}
    assert (cfg["spike"]["window"], cfg["spike"]["min_history"], cfg["spike"]["sigma_floor_rel"]) == (50, 10, 0.02)


def test_cli_reads_the_controllers_toml_and_env(tmp_path, capsys, monkeypatch):
    path = spike_csv(tmp_path)
    toml = tmp_path / "cliffguard.toml"
    toml.write_text("[spike]\nbudget = 3.0\n")
    _, out, _ = cli(capsys, path, "--json", "--config", toml)
    assert json.loads(out)["config"]["spike"]["budget"] == 3.0
    monkeypatch.setenv("CLIFFGUARD_SPIKE__BUDGET", "2")
    _, out, _ = cli(capsys, path, "--json", "--config", toml)
    assert json.loads(out)["config"]["spike"]["budget"] == 2.0  # env beats the file
    _, out, _ = cli(capsys, path, "--json", "--config", toml, "--budget", "4")
    assert json.loads(out)["config"]["spike"]["budget"] == 4.0  # flags beat both


@pytest.mark.parametrize(
    "argv, words",
    [
        ([], "give either a CSV file or --run"),
        (["x.csv", "--run", "r"], "give either a CSV file or --run"),
        (["--run", "r"], "--run needs --db"),
        (["{csv}", "--budget", "0"], "budget"),
        (["{bad}"], "line 3: loss 'oops' is not a number"),
    ],
)
def test_cli_errors_are_clear_and_exit_nonzero(tmp_path, capsys, argv, words):
    bad = tmp_path / "bad.csv"
    bad.write_text("step,loss\n0,2.0\n1,oops\n")
    argv = [a.format(csv=spike_csv(tmp_path), bad=bad) for a in argv]
    rc, out, err = cli(capsys, *argv)
    assert rc == 2 and words in err and out == ""


def test_cli_as_a_subprocess(tmp_path):
    curve = inject(base_curve(77, 1200), "nan", 77)
    path = tmp_path / "curve.csv"
    path.write_text("step,loss\n" + "".join(f"{s},{x}\n" for s, x in curve.points()))
    proc = subprocess.run([sys.executable, "-m", "cliffguard.cli", "backtest", str(path), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    crit = [e for e in json.loads(proc.stdout)["events"] if e["rule"] == "nonfinite"]
    assert crit[0]["step"] == curve.labels[0].onset and crit[0]["level"] == "critical"


# -- stored runs -----------------------------------------------------------------------------


def _step_data(loss: float, **over):
    data = {"loss": loss, "loss_local": loss, "lr": 1e-3, "lr_scale": 1.0, "grad_norm": 1.0, "tokens": 1,
            "step_time_s": 0.1, "data_wait_s": 0.0, "comm_exposed_s": 0.0, "compute_s": 0.1,
            "tokens_per_s": 10.0, "mfu": 0.5, "mem_allocated": 0, "mem_reserved": 0, "loss_scale": 1.0,
            "skipped": False, "clipped_layers": 0, "guard": "ok", "layer_grad_norms": {"h.0": 0.5}}
    data.update(over)
    return data


def store_run(url: str) -> str:
    from cliffguard.controller.store.db import init_db, make_engine, session_scope
    from cliffguard.controller.store.ingest import ingest_events

    run = f"bt-{uuid.uuid4().hex[:8]}"
    events = []
    for s in range(80):
        loss = math.nan if s == 70 else (MODERATE if 50 <= s < 55 else healthy(s))
        for rank in (0, 1):
            events.append(make_event(EventType.STEP, run, s, _step_data(loss), rank=rank, world=2, ts=1000.0 + s))
    engine = make_engine(url)
    try:
        init_db(engine)
        with session_scope(engine) as session:
            ingest_events(session, events)
    finally:
        engine.dispose()
    return run


def check_stored_run(url: str, run: str, capsys) -> None:
    rc, out, err = cli(capsys, "--run", run, "--db", url, "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["points"] == 160 and doc["source"] == f"run {run}"
    assert [(e["step"], e["level"], e["rule"]) for e in doc["events"]] == [
        (50, "warn", "loss_spike"), (52, "critical", "loss_spike"), (70, "critical", "nonfinite")]
    rc, _, err = cli(capsys, "--run", "no-such-run", "--db", url)
    assert rc == 2 and "no step metrics" in err


def test_stored_run_from_sqlite(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    check_stored_run(url, store_run(url), capsys)


@pytest.mark.postgres
def test_stored_run_from_postgresql(pg_url, capsys):
    check_stored_run(pg_url, store_run(pg_url), capsys)


def test_unreadable_store_is_a_clear_error(tmp_path, capsys):
    rc, _, err = cli(capsys, "--run", "r", "--db", f"sqlite:///{tmp_path / 'empty.db'}")
    assert rc == 2 and "OperationalError" in err


# -- real-curve input shapes, interval, folders --------------------------------------------------


def test_empty_loss_rows_are_skipped_and_counted_extra_columns_ignored():
    text = "step,loss,eval_loss,lr\n10,2.5,,1e-3\n20,,2.4,1e-3\n30,2.4,,1e-3\n"
    parsed = bt.parse_loss_csv(text)
    assert parsed.points == [(10, 2.5), (30, 2.4)] and parsed.skipped_empty == 1 and parsed.grad_norms is None
    with pytest.raises(bt.CsvError, match="no data rows \\(2 with an empty loss\\)"):
        bt.parse_loss_csv("step,loss\n1,\n2,\n")


def test_grad_norm_column_feeds_the_grad_norm_rule_and_leads_the_loss():
    # the norm jumps x20 one logged point before the loss does: the alert comes first
    rows = [(s, healthy(s), 1.0 + 0.01 * (s % 3)) for s in range(60)]
    rows += [(60, healthy(60), 20.0)] + [(61 + i, 2.0 * 1.5, 30.0) for i in range(3)]
    text = "step,loss,grad_norm\n" + "".join(f"{s},{x},{g}\n" for s, x, g in rows)
    parsed = bt.parse_loss_csv(text)
    events = bt.replay_points(parsed.points, None, parsed.grad_norms)
    first_norm = min(e.step for e in events if e.rule == "grad_norm")
    first_loss = min(e.step for e in events if e.rule == "loss_spike" and e.level == "critical")
    assert first_norm == 60 < first_loss == 61


def test_cadence_reports_the_inferred_interval():
    assert bt.cadence([10, 20, 30, 40]) == {"interval_steps": 10.0, "max_gap_steps": 10, "irregular": False}
    assert bt.cadence([0, 40, 80, 120, 500])["irregular"] is True
    assert bt.infer_interval([5]) == 1.0


def test_cli_json_of_a_csv_carries_the_interval_and_skipped_rows(tmp_path, capsys):
    path = tmp_path / "sparse.csv"
    path.write_text("step,loss,eval_loss\n" + "".join(f"{10 * s},{healthy(s)},\n" for s in range(1, 60))
                    + "600,,2.0\n")
    rc, out, _ = cli(capsys, path, "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["interval"]["interval_steps"] == 10.0 and doc["skipped_rows"] == 1
    rc, out, _ = cli(capsys, path)
    assert "logged every 10 steps" in out.splitlines()[0] and "1 rows with an empty loss skipped" in out


def labelled_folder(tmp_path):
    folder = tmp_path / "curves"
    folder.mkdir()
    (folder / "pos.csv").write_text("step,loss\n" + "".join(
        f"{s},{MODERATE if 60 <= s < 65 else healthy(s)}\n" for s in range(100)))
    (folder / "neg.csv").write_text("step,loss\n" + "".join(f"{s},{healthy(s)}\n" for s in range(100)))
    (folder / "labels.json").write_text(json.dumps({"positives": {"pos": [[60, 70]]}, "negatives": ["neg"]}))
    return folder


def test_cli_scores_a_labelled_folder(tmp_path, capsys):
    folder = labelled_folder(tmp_path)
    rc, out, _ = cli(capsys, folder, "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["summary"]["recall"] == 1.0 and doc["summary"]["negative_criticals"] == 0
    pos = next(c for c in doc["curves"] if c["name"] == "pos")
    assert pos["delays_steps"] == [2] and pos["delays_points"] == [2]  # patience 3 at one step a point
    rc, out, _ = cli(capsys, folder, "--labels", folder / "labels.json")
    assert rc == 0 and out.splitlines()[-1].startswith("recall 1.00 (1/1)")


def test_cli_sweep_prints_the_trade_off(tmp_path, capsys):
    rc, out, _ = cli(capsys, labelled_folder(tmp_path), "--sweep", "k_crit=5,50")
    lines = out.splitlines()
    assert rc == 0 and lines[1].startswith("spike.k_crit=5") and "1.00 1/1" in lines[1]
    assert lines[2].startswith("spike.k_crit=50") and "0.00 0/1" in lines[2]
    rc, _, err = cli(capsys, spike_csv(tmp_path), "--sweep", "k_crit=5")
    assert rc == 2 and "need a folder" in err
    rc, _, err = cli(capsys, tmp_path / "curves", "--sweep", "k_crit")
    assert rc == 2 and "expected FIELD=V1,V2" in err


def test_cli_text_of_a_stored_run_with_grad_norm_evidence(tmp_path, capsys):
    from cliffguard.controller.store.db import init_db, make_engine, session_scope
    from cliffguard.controller.store.ingest import ingest_events

    url = f"sqlite:///{tmp_path / 'gn.db'}"
    events = [make_event(EventType.STEP, "gn", s, _step_data(healthy(s), grad_norm=1000.0 if s == 40 else 1.0),
                         ts=1000.0 + s) for s in range(45)]
    engine = make_engine(url)
    try:
        init_db(engine)
        with session_scope(engine) as session:
            ingest_events(session, events)
    finally:
        engine.dispose()
    rc, out, err = cli(capsys, "--run", "gn", "--db", url)
    assert rc == 0, err
    assert "grad_norm" in out and "logged every 1 steps" in out.splitlines()[0]
