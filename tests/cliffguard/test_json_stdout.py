"""A --json command's stdout holds its document alone: what a library prints while it runs (DeepSpeed's
logger writes to stdout, and accelerate imports it whenever it is installed) goes to stderr."""

from __future__ import annotations

import argparse
import json

from cliffguard.cli import main
from cliffguard.commands import json_stdout


def test_while_held_prints_go_to_stderr_and_the_document_to_stdout(capsys):
    with json_stdout.held():
        print("[WARNING] Setting accelerator to CPU")  # a library's line
        json_stdout.emit(json.dumps({"ok": True}))
    out, err = capsys.readouterr()
    assert json.loads(out) == {"ok": True} and "Setting accelerator" in err
    json_stdout.emit("after")  # not held: plain stdout
    assert capsys.readouterr().out == "after\n"


def test_which_commands_want_json_on_stdout():
    ns = argparse.Namespace
    assert json_stdout.wants_json_stdout(ns(json=True)) and json_stdout.wants_json_stdout(ns(json="-"))
    assert not json_stdout.wants_json_stdout(ns(json="out.json")) and not json_stdout.wants_json_stdout(ns(json=False))
    assert not json_stdout.wants_json_stdout(ns())


def test_a_json_command_run_through_main_keeps_library_output_off_stdout(capsys, monkeypatch):
    from cliffguard.commands import plan

    real = plan.run

    def chatty(args):
        print("a library's banner")
        return real(args)

    monkeypatch.setattr(plan, "run", chatty)
    assert main(["plan", "--gpus", "8", "--gpu-mem-gb", "80", "--params", "1e9", "--json"]) == 0
    out, err = capsys.readouterr()
    assert "configs" in json.loads(out) and "a library's banner" in err
