"""One scenario in a process of its own: ``python -m bench.faults.worker NAME --out FILE --tmp DIR``.

The runner reads FILE; a worker that dies without writing it crashed, one past its timeout hung.
The suite's broker and PostgreSQL come in ``CLIFFGUARD_FAULTS_BOOTSTRAP`` / ``CLIFFGUARD_FAULTS_PG_URL``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import traceback
from pathlib import Path

from bench.faults.harness import Ctx, Measured
from bench.faults.registry import scenarios

BOOTSTRAP_ENV = "CLIFFGUARD_FAULTS_BOOTSTRAP"
PG_ENV = "CLIFFGUARD_FAULTS_PG_URL"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("name")
    p.add_argument("--out", required=True)
    p.add_argument("--tmp", required=True)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    sc = scenarios()[args.name]
    ctx = Ctx(bootstrap=os.environ[BOOTSTRAP_ENV], pg_url=os.environ.get(PG_ENV) or None, tmp=Path(args.tmp))
    error = ""
    try:
        m = sc.func(ctx)
    except AssertionError as exc:  # ScenarioFailed included: a check that stops the scenario
        m = Measured()
        m.failures.append(str(exc) or repr(exc))
        error = traceback.format_exc(limit=4)
    except Exception as exc:  # noqa: BLE001 - reported as the row's failure, the suite goes on
        m = Measured()
        m.failures.append(f"error: {type(exc).__name__}: {exc}")
        error = traceback.format_exc(limit=6)
    out = {**m.to_dict(), "traceback": error}
    Path(args.out).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
