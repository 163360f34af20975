#!/usr/bin/env bash
# Install everything the test suite needs on a fresh Debian machine, start PostgreSQL, run it.
# This is the README's test command, and what .ci/run calls: every tier (plain `python -m pytest`
# runs the unit tier only, see tests/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ]; then SUDO=""; ASPG="runuser -u postgres --"; else SUDO="sudo"; ASPG="sudo -u postgres"; fi
need=()
command -v pg_ctlcluster >/dev/null 2>&1 || need+=(postgresql)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# the slurm tier: a one-machine cluster (cliffguard slurm up) from Debian's packages
{ [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/munged ]; } || need+=(slurm-wlm munge)
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing ${need[*]} (Debian packages)"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

echo "== installing cliffguard with test extras"
python3 -m pip install -q -e '.[all,test]'

# PostgreSQL: start the distribution's cluster and make a throwaway database for the tests.
ver=$(ls /usr/lib/postgresql | sort -n | tail -1)
cluster=$(pg_lsclusters -h 2>/dev/null | awk 'NR==1{print $1" "$2}')
if [ -z "$cluster" ]; then $SUDO pg_createcluster "$ver" main >/dev/null; cluster="$ver main"; fi
$SUDO pg_ctlcluster $cluster start 2>/dev/null || true
port=$(pg_lsclusters -h | awk 'NR==1{print $3}')
for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p "$port" && break; sleep 0.5; done
$ASPG psql -q -p "$port" -c "ALTER USER postgres PASSWORD 'cliffguard'" >/dev/null
$ASPG psql -q -p "$port" -tc "SELECT 1 FROM pg_database WHERE datname='cliffguard_test'" | grep -q 1 \
  || $ASPG createdb -p "$port" cliffguard_test
export CLIFFGUARD_TEST_PG_URL="postgresql+psycopg://postgres:cliffguard@127.0.0.1:${port}/cliffguard_test"

echo "== ruff"
python3 -m ruff check .
echo "== docs (mkdocs --strict: a broken link or page fails)"
python3 -m mkdocs build --strict --site-dir "$(mktemp -d)"
echo "== pytest"
python3 -m pytest -q -p no:cacheprovider --all-tiers --durations=30 "$@"
