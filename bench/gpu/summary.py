"""The GPU check's one table: each step's goal, its figure and pass/fail, from what check.sh wrote.

    python -m bench.gpu.summary OUT_DIR        (bench/gpu/check.sh runs it last)

Reads ``OUT_DIR/steps.tsv`` (a line per step check.sh ran: name, exit status, seconds), each
step's JSON (or JUnit XML for the tests) and ``env.json``; writes ``OUT_DIR/summary.json``; prints
the table; exits 1 when a step failed or none ran. A step that timed out (124, or 137 after the
kill), exited non-zero, or was not run for want of time (-1) fails whatever its file says; so does
a step that ran but wrote no figure.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

OVERHEAD_GOAL = 1.01
"""Step time with the agent on / off, histograms every 10 steps (issue 28)."""
BLOCK_GOAL = 0.05
"""Training-thread blocking of an async checkpoint / a synchronous torch.save (issue 28)."""


@dataclass(slots=True)
class Row:
    step: str
    goal: str
    figure: str
    passed: bool
    detail: str = ""
    seconds: float = 0.0


def _overhead(res: dict) -> tuple[str, bool, str]:
    ratio = res["ratio"]
    spread = res["ratio_spread"]
    detail = (f"{res['device_name']}, GPT {res.get('size', 'default')} {res['n_params'] / 1e6:.1f}M, batch "
              f"{res['global_batch']}, {res['world']} rank(s); q1-q3 {spread['q1']:.3f}-{spread['q3']:.3f}; hist every "
              f"step {res['ratio_hist_every_step']:.3f}; agent CPU {res['cpu_attributed_ratio']:.3f}; off "
              f"{1000 * res['median_step_s']['off']:.2f} ms/step")
    return f"{ratio:.3f}", ratio <= OVERHEAD_GOAL, detail


def _stall(res: dict) -> tuple[str, bool, str]:
    # the bench's own rule (block_ratio_ok): the median and the mean of each size, the worst of them
    worst = max(max(r["ratio_block"], r["ratio_block_mean"]) for r in res["sizes"].values())
    parts = [f"{name} {r['ratio_block']:.3f} (mean {r['ratio_block_mean']:.3f}, p95 {r['ratio_block_p95']:.3f}; "
             f"sync {r['sync_block_ms']:.1f} ms, async {r['async_block_ms']:.2f} ms)" for name, r in res["sizes"].items()]
    return f"{worst:.3f}", worst <= BLOCK_GOAL, f"{res.get('device_name', '?')}: " + "; ".join(parts)


def _tests(path: Path) -> tuple[str, bool, str]:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
    figure = f"{passed} passed, {n['failures'] + n['errors']} failed, {n['skipped']} skipped"
    # on a GPU no device case may skip: a skip there means the test did not see the GPU
    ok = n["tests"] > 0 and n["failures"] == n["errors"] == n["skipped"] == 0
    failed = [f"{c.get('classname', '')}.{c.get('name', '')}" for s in suites for c in s.iter("testcase")
              if c.find("failure") is not None or c.find("error") is not None]
    return figure, ok, ("failed: " + ", ".join(failed)) if failed else ""


def _setup(env: dict) -> tuple[str, bool, str]:
    return (f"torch {env.get('torch', '?')}", True, f"{env.get('gpu', '?')}, CUDA {env.get('cuda', '?')}, Python "
            f"{env.get('python', '?')}, torch: {env.get('torch_source', '?')}")


# step name -> (goal, file it writes, reader)
STEPS: dict[str, tuple[str, str, Callable[[Path], tuple[str, bool, str]]]] = {
    "setup": ("a CUDA torch and the project installed", "env.json", lambda p: _setup(json.loads(p.read_text()))),
    "cuda_tests": ("every cuda case passes, none skipped", "cuda_tests.xml", _tests),
    "agent_overhead": (f"ratio <= {OVERHEAD_GOAL} (hist every 10)", "agent_overhead.json",
                       lambda p: _overhead(json.loads(p.read_text()))),
    "agent_overhead_wide": (f"ratio <= {OVERHEAD_GOAL} (hist every 10)", "agent_overhead_wide.json",
                            lambda p: _overhead(json.loads(p.read_text()))),
    "checkpoint_stall": (f"block <= {BLOCK_GOAL} x sync save", "checkpoint_stall.json",
                         lambda p: _stall(json.loads(p.read_text()))),
}




def rows(out: Path) -> list[Row]:
    """One row per line of steps.tsv, in order."""
    found: list[Row] = []
    tsv = out / "steps.tsv"
    lines = tsv.read_text().splitlines() if tsv.exists() else []
    for line in lines:
        name, rc_s, secs = line.split("\t")
        rc, seconds = int(rc_s), float(secs)
        goal, fname, read = STEPS.get(name, ("exit 0", "", lambda p: ("", True, "")))
        path = out / fname if fname else None
        figure, ok, detail = "", rc == 0, ""
        if path is not None and path.exists():
            try:
                figure, ok, detail = read(path)
                ok = ok and rc == 0
            except (KeyError, ValueError, TypeError, ET.ParseError) as exc:  # a file cut short by a timeout
                figure, ok, detail = "unreadable", False, f"{fname}: {exc!r}"
        elif path is not None:
            figure, ok = "none", False
        if rc == -1:
            figure, detail = "not run", "no time left in the check's budget"
        elif rc in (124, 137):
            detail = f"timed out after {seconds:.0f} s; " + detail
        elif rc != 0:
            detail = f"exit {rc}; " + detail
        found.append(Row(name, goal, figure, ok, detail.strip("; "), seconds))
    return found


def table(found: list[Row]) -> str:
    head = ("step", "goal", "figure", "result", "s")
    cells = [(r.step, r.goal, r.figure, "pass" if r.passed else "FAIL", f"{r.seconds:.0f}") for r in found]
    widths = [max(len(c[i]) for c in [head, *cells]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in [head, *cells]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += [f"  {r.step}: {r.detail}" for r in found if r.detail]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    out = Path(args[0])
    found = rows(out)
    passed = bool(found) and all(r.passed for r in found)
    env = json.loads((out / "env.json").read_text()) if (out / "env.json").exists() else {}
    (out / "summary.json").write_text(json.dumps({"passed": passed, "env": env, "steps": [asdict(r) for r in found]},
                                                 indent=2) + "\n")
    print(table(found))
    print(f"GPU check: {'every step passed' if passed else 'FAILED' if found else 'no step ran'} "
          f"(summary.json in {out})")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
