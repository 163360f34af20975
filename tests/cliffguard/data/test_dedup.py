import pytest

from cliffguard.data.corpus import corpus_files
from cliffguard.data.dedup import DedupConfig, Deduplicator, jaccard, shingles
from cliffguard.data.pipeline import run_pass


def test_shingles_and_exact_jaccard():
    assert shingles("A b, c d", 2) == {"a b", "b c", "c d"}
    assert shingles("one two", 5) == {"one two"}
    assert shingles("  ", 5) == set()
    assert jaccard({"a", "b"}, {"b", "c"}) == pytest.approx(1 / 3)


def test_recall_and_precision_on_planted_near_duplicates(planted):
    root, dups, far = planted
    d = Deduplicator(DedupConfig(threshold=0.8))
    found = {}
    for f in corpus_files(root):
        v = d.add(str(f), f.read_text())
        if v.duplicate_of is not None:
            found[str(f)] = v.duplicate_of
    true_pos = sum(found.get(k) == rep for k, rep in dups.items())
    recall = true_pos / len(dups)
    precision = true_pos / max(1, len(found))
    assert recall >= 0.9 and precision >= 0.9, (recall, precision, found)
    assert not set(found) & set(far)  # 30% rewritten is a different document
    assert set(d.clusters) <= set(dups.values())


def test_report_clusters_and_exact_jaccard_precision_sample(planted):
    root, dups, _ = planted
    manifest, report = run_pass(root, corpus_files(root))
    removed = {x["path"] for x in manifest["documents"] if not x["kept"]}
    assert removed == set(dups)
    d = report["dedup"]
    assert d["duplicates_removed"] == 20 and len(d["clusters"]) == 20
    assert all(c["kept"] == dups[c["removed"][0]] for c in d["clusters"])
    assert len(d["precision_sample"]) == 20
    assert all(s["exact_jaccard"] >= 0.8 for s in d["precision_sample"])
    assert d["precision_estimate"] == 1.0


def test_config_is_validated():
    with pytest.raises(ValueError, match="^threshold:"):
        DedupConfig(threshold=1.5)
