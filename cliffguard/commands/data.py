"""``cliffguard data``: a streaming data-quality pass over a text corpus; writes a manifest the trainer reads.

Near-duplicates (MinHash + LSH) are removed, the trainer's data rules (garbled text, URL piles)
and a locally trained byte-trigram perplexity lower weights, a curriculum assigns categories and
per-phase mixture weights, and documents matching a benchmark item's n-gram are removed last.
Point the trainer at the manifest with ``[data] weights_manifest`` (trainer/data.py); the reference
model is saved beside it (``MANIFEST.lm.npz``, named in the manifest), and the trainer's data
watch scores each batch with it while training. With
``--json`` stdout carries only the report JSON; progress goes to stderr. Bad input is an error
naming it (exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from cliffguard.commands.json_stdout import emit
from cliffguard.data.contamination import ContaminationIndex, load_benchmark
from cliffguard.data.corpus import corpus_files
from cliffguard.data.curriculum import Curriculum, parse_curriculum
from cliffguard.data.dedup import DedupConfig
from cliffguard.data.manifest import write_json
from cliffguard.data.pipeline import PassConfig, run_pass
from cliffguard.trainer.byte_lm import MODEL_SUFFIX


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("data", help="data-quality pass over a text corpus: dedup, contamination, reweighting, curriculum",
                       description=__doc__)
    p.add_argument("corpus", metavar="CORPUS_DIR", help="directory of text files (one file = one document)")
    p.add_argument("--suffix", action="append", default=[],
                   help="read only files with this suffix (repeatable, e.g. --suffix .py); default: every file")
    p.add_argument("--benchmarks", nargs="+", default=[], metavar="FILE",
                   help="benchmark items: .jsonl with a 'question'/'text' field, or .txt one item per line")
    p.add_argument("--ngram", type=int, default=13, help="words per contamination n-gram (default 13)")
    p.add_argument("--threshold", type=float, default=0.8, help="near-duplicate Jaccard threshold (default 0.8)")
    p.add_argument("--num-perm", type=int, default=128, help="MinHash permutations (default 128)")
    p.add_argument("--curriculum", metavar="SPEC", help="curriculum JSON (inline or a file): categories and phases")
    p.add_argument("--live-reweight-floor", type=float, metavar="F",
                   help="let the trainer's live reweighting ([data.reweight]) lower any category's weight down to "
                        "x F while training (written to the manifest as live_reweight)")
    p.add_argument("--out", required=True, metavar="MANIFEST.json", help="where to write the manifest")
    p.add_argument("--report", metavar="REPORT.json", help="also write the report here")
    p.add_argument("--progress-every", type=int, default=500, help="a progress line every N documents (stderr)")
    p.add_argument("--json", action="store_true", help="print the report as JSON (only JSON on stdout)")
    return p


def _progress(every: int):
    t0 = time.monotonic()

    def show(phase: str, done: int, total: int) -> None:
        if every > 0 and (done % every == 0 or done == total):
            print(f"data: {phase} {done}/{total} documents ({time.monotonic() - t0:.1f}s)", file=sys.stderr, flush=True)

    return show


def run(args: argparse.Namespace) -> int:
    try:
        files = corpus_files(args.corpus)
        if args.suffix:
            files = [f for f in files if f.suffix in args.suffix]
            if not files:
                raise ValueError(f"corpus: {args.corpus!r} holds no files with suffix {args.suffix}")
        items = [it for path in args.benchmarks for it in load_benchmark(path)]
        index = ContaminationIndex(items, n=args.ngram) if items else None
        curriculum = parse_curriculum(args.curriculum) if args.curriculum else Curriculum()
        cfg = PassConfig(dedup=DedupConfig(threshold=args.threshold, num_perm=args.num_perm))
        if args.live_reweight_floor is not None and not 0 <= args.live_reweight_floor <= 1:
            raise ValueError(f"--live-reweight-floor: {args.live_reweight_floor} is not in [0, 1]")
        model = Path(args.out).with_suffix(MODEL_SUFFIX)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        manifest, report = run_pass(args.corpus, files, cfg=cfg, contamination=index, curriculum=curriculum,
                                    progress=_progress(args.progress_every), model_path=model)
    except ValueError as exc:
        print(f"cliffguard data: {exc}", file=sys.stderr)
        return 2
    if args.live_reweight_floor is not None:
        manifest["live_reweight"] = {"floor": args.live_reweight_floor}
    write_json(args.out, manifest)
    if args.report:
        write_json(args.report, report)
    if args.json:
        emit(json.dumps(report))
    else:
        d = report["dedup"]
        print(f"{report['documents']} documents ({report['skipped_binary']['count']} binary files skipped): "
              f"{report['kept']} kept, {report['removed']} removed; reasons {report['reasons']}")
        print(f"near-duplicates: {d['duplicates_removed']} in {len(d['clusters'])} clusters; "
              f"precision estimate {d['precision_estimate']} on {len(d['precision_sample'])} pairs")
        print(f"contaminated: {len(report['contamination'])}; manifest -> {args.out}, reference model -> "
              f"{manifest['perplexity_model']['path']}  ({report['seconds']['total']}s)")
    return 0
