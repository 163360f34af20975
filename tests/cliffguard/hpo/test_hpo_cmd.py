import json

import pytest

from cliffguard.cli import main


@pytest.mark.parametrize("argv,option", [(["--trials", "0"], "--trials"), (["--window", "0"], "--window"),
                                         (["--storage", "mysql://h/db"], "--storage"), (["--db", "redis://h"], "--db"),
                                         (["--fault", "lr_blowup@1x5:2"], "--fault"), (["--fault", "1:boom@3"], "--fault")])
def test_bad_input_exits_2_naming_the_option(argv, option, capsys, tmp_path):
    assert main(["hpo", "--out-dir", str(tmp_path), *argv]) == 2
    assert option in capsys.readouterr().err


def test_json_run(capsys, tmp_path):
    argv = ["hpo", "--trials", "2", "--window", "4", "--warmup", "2", "--seed", "1", "--out-dir", str(tmp_path),
            "--n-layer", "1", "--n-embd", "32", "--seq-len", "32", "--max-bytes", "200000", "--json"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert [t["state"] for t in doc["trials"]] == ["COMPLETE", "COMPLETE"]
    assert doc["best"]["params"].keys() == {"lr", "global_batch", "beta1", "beta2"}
    assert doc["storage"] == f"sqlite:///{tmp_path}/optuna.db"
    assert "trial 1" in err and "best" in err
