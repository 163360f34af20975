import json
import random

import pytest

from cliffguard.data.contamination import ContaminationIndex, load_benchmark
from cliffguard.data.corpus import corpus_files
from cliffguard.data.dedup import words
from cliffguard.data.pipeline import run_pass

from .conftest import random_doc

QUESTIONS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she earn?",
    "Which of the following best explains why the sky appears blue to an observer standing on the ground at noon?",
]


def test_planted_benchmark_items_are_removed_last_with_their_item_and_ngram(tmp_path):
    rng = random.Random(3)
    bench = tmp_path / "bench.jsonl"
    bench.write_text("\n".join(json.dumps({"question": q, "answer": "x"}) for q in QUESTIONS) + "\n")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    planted = {}
    for i in range(30):
        doc = random_doc(rng, 200)
        if i in (4, 17):
            q = QUESTIONS[i % 3].upper().replace(" ", "   ")  # case and spacing do not hide a copy
            doc[100:100] = q.split()
            planted[str((corpus / f"d{i:02d}.txt").resolve())] = f"{bench}:{i % 3 + 1}"
        (corpus / f"d{i:02d}.txt").write_text(" ".join(doc))
    index = ContaminationIndex(load_benchmark(bench), n=13)
    manifest, report = run_pass(corpus, corpus_files(corpus), contamination=index)
    removed = {d["path"]: d for d in manifest["documents"] if not d["kept"]}
    assert set(removed) == set(planted)
    for path, doc in removed.items():
        (reason,) = [r for r in doc["reasons"] if r["reason"] == "contamination"]
        assert reason["benchmark_item"] == planted[path]
        assert len(reason["ngram"].split()) == 13 and reason["ngram"] in " ".join(words(QUESTIONS[int(planted[path][-1]) - 1]))
        assert doc["weight"] == 0.0
    assert {c["path"] for c in report["contamination"]} == set(planted)
    assert report["reasons"]["contamination"] == 2


def test_short_items_match_whole_and_tiny_ones_are_ignored(tmp_path):
    f = tmp_path / "b.txt"
    f.write_text("what is the capital city of the republic of france\nyes\n")
    index = ContaminationIndex(load_benchmark(f), n=13)
    assert index.ignored == [f"{f}:2"]
    hit = index.match("Quiz: What is the capital city of the Republic of France? Paris.")
    assert hit is not None and hit.item == f"{f}:1"
    assert index.match("the capital city of france is paris") is None


@pytest.mark.parametrize(("name", "content", "match"), [
    ("b.csv", "q,a\n", "unknown format '.csv'"),
    ("b.jsonl", '{"prompt": "x"}\n', "line 1 has no string 'question' or 'text' field"),
    ("b.jsonl", "not json\n", "line 1 is not JSON"),
    ("b.txt", "\n\n", "holds no items"),
])
def test_bad_benchmark_files_are_errors_naming_the_file(tmp_path, name, content, match):
    (tmp_path / name).write_text(content)
    with pytest.raises(ValueError, match=match) as exc:
        load_benchmark(tmp_path / name)
    assert str(tmp_path / name) in str(exc.value)


def test_missing_benchmark_file(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_benchmark(tmp_path / "nope.jsonl")
