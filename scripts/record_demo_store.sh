#!/usr/bin/env bash
# Record a short real demo run's store for the dashboard tests (a fixture file, not a test).
#
#   scripts/record_demo_store.sh [OUT.db] [STEPS]
#
# Runs `cliffguard demo` without the dashboard (broker on a free port, a scratch directory),
# then copies the SQLite store it leaves behind to OUT.db (default
# tests/dashboard/data/demo_store.db) after folding the WAL into the main file. The store holds
# everything the controller wrote for one 2-rank run with a resumed corrupted batch and a
# rolled-back LR blow-up: steps, histograms, checkpoints, validations, incidents, transitions,
# commands and acks, alerts (no endpoints -> none delivered), data flags. The summary JSON goes
# next to it (OUT.json) so a test can assert against the facts of the recording.
set -euo pipefail
out="${1:-tests/dashboard/data/demo_store.db}"
steps="${2:-200}"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$(dirname "$out")"
status=0
python -m cliffguard.cli demo --steps "$steps" --no-dashboard --broker-port 0 \
    --dir "$scratch/demo" --json "${out%.db}.json" || status=$?
python - "$scratch/demo/cliffguard.db" "$out" <<'PY'
import sqlite3, sys
src, dst = sys.argv[1], sys.argv[2]
con = sqlite3.connect(src)
con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
with sqlite3.connect(dst) as out:
    con.backup(out)
con.close()
print(f"recorded store: {dst}")
PY
exit "$status"
