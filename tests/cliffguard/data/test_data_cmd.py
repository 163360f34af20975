import json

import pytest

from cliffguard.cli import main
from cliffguard.trainer.data import DataConfig, Sampler, load_corpus

from .conftest import perturb, random_doc


@pytest.fixture
def corpus(tmp_path):
    import random

    rng = random.Random(5)
    root = tmp_path / "corpus"
    (root / "src").mkdir(parents=True)
    docs = [random_doc(rng, 600) for _ in range(8)]
    for i, d in enumerate(docs):
        (root / "src" / f"m{i}.py").write_text(" ".join(d))
        (root / f"n{i}.md").write_text(" ".join(random_doc(rng, 600)))
    (root / "src" / "m9.py").write_text(" ".join(perturb(rng, docs[0], 0.01)))  # near-duplicate of m0
    (root / "blob.bin").write_bytes(b"\x00\x01\x02" * 100)
    return root


def test_cli_writes_manifest_and_json_report_and_the_trainer_follows_it(corpus, tmp_path, capsys):
    spec = json.dumps({"categories": {"code": ["**/*.py"]}, "default": "prose",
                       "phases": [{"until": 0.5, "weights": {"prose": 1, "code": 0.2}}, {"until": 1.0}]})
    out, rep = tmp_path / "m.json", tmp_path / "r.json"
    rc = main(["data", str(corpus), "--curriculum", spec, "--out", str(out), "--report", str(rep), "--json",
               "--progress-every", "5"])
    captured = capsys.readouterr()
    assert rc == 0
    report = json.loads(captured.out)  # only JSON on stdout
    assert "data: scan" in captured.err
    assert report == json.loads(rep.read_text())
    assert report["documents"] == 17 and report["skipped_binary"]["count"] == 1
    assert report["dedup"]["duplicates_removed"] == 1
    manifest = json.loads(out.read_text())
    by_name = {d["path"].rsplit("/", 1)[1]: d for d in manifest["documents"]}
    assert not by_name["m9.py"]["kept"] and by_name["m9.py"]["reasons"][0]["of"].endswith("m0.py")
    assert by_name["m0.py"]["category"] == "code" and by_name["n0.md"]["category"] == "prose"
    assert manifest["curriculum"]["phases"][0]["until"] == 0.5
    model = manifest["perplexity_model"]  # the reference model, saved for the trainer's data watch
    assert model["path"] == str((tmp_path / "m.lm.npz").resolve()) and model["median"] == report["perplexity"]["median"]
    from cliffguard.trainer.data_watch import manifest_model

    assert manifest_model(str(out)) == model["path"]

    cfg = DataConfig(paths=[str(corpus)], seq_len=16, max_bytes=100_000, block_bytes=1024, apply_rules=False,
                     weights_manifest=str(out), suffixes=[".py", ".md"])
    c = load_corpus(cfg)
    m9 = c.files.index(str(corpus / "src" / "m9.py"))
    s = Sampler(c, cfg, global_batch=16)
    drawn = {sid for step in range(40) for sid in s.sample_ids(step)}
    assert not any(int(c.sample_files[sid]) == m9 for sid in drawn)  # a removed document is never sampled


@pytest.mark.parametrize(("setup", "argv_tail", "message"), [
    (lambda p: None, ["missing"], "does not exist"),
    (lambda p: (p / "empty").mkdir(), ["empty"], "holds no files"),
    (lambda p: ((p / "bin").mkdir(), (p / "bin" / "x.dat").write_bytes(b"\x00" * 10)), ["bin"],
     "holds no text documents (1 binary"),
    (lambda p: ((p / "c").mkdir(), (p / "c" / "a.txt").write_text("hi"), (p / "q.csv").write_text("x")),
     ["c", "--benchmarks", "q.csv"], "unknown format"),
    (lambda p: ((p / "c").mkdir(), (p / "c" / "a.txt").write_text("hi")), ["c", "--curriculum", "{bad"],
     "not valid JSON"),
])
def test_cli_bad_input_is_an_error_naming_it(tmp_path, capsys, monkeypatch, setup, argv_tail, message):
    monkeypatch.chdir(tmp_path)
    setup(tmp_path)
    rc = main(["data", *argv_tail, "--out", str(tmp_path / "m.json")])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and argv_tail[-1] in err
    assert not (tmp_path / "m.json").exists()


def test_live_reweight_bounds_go_into_the_manifest(corpus, tmp_path, capsys):
    out = tmp_path / "m.json"
    assert main(["data", str(corpus), "--out", str(out), "--live-reweight-floor", "0.25"]) == 0
    assert json.loads(out.read_text())["live_reweight"] == {"floor": 0.25}
    assert main(["data", str(corpus), "--out", str(out), "--live-reweight-floor", "2"]) == 2
    assert "--live-reweight-floor: 2.0 is not in [0, 1]" in capsys.readouterr().err
