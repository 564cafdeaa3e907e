#!/usr/bin/env bash
# The demo: the example shop on a SQLite file, with zero servers.
# Creates a virtualenv, installs, migrates, places orders (each enqueues an
# email and an outbox webhook in the order's own transaction), runs a real
# worker, lets the scheduler fire, and prints what happened.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

PY=""
for candidate in python3.13 python3.12 python3.11 python3; do
  if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then
    PY=$(command -v "$candidate"); break
  fi
done
[ -n "$PY" ] || { echo "Python 3.11+ is needed"; exit 1; }

VENV="$ROOT/.venv-demo"
if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV with $("$PY" --version)"
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/pip" install -q --disable-pip-version-check -e ".[dev]" 2>&1 | grep -v '^WARNING: Location' || true

cd example_project
export DATABASE_URL="sqlite:///$ROOT/example_project/db/demo.sqlite3"
rm -f db/demo.sqlite3 db/demo.sqlite3-wal db/demo.sqlite3-shm
manage() { "$VENV/bin/python" manage.py "$@"; }

echo "== migrate"
manage migrate -v 0
echo "== place three orders (order row + email job + webhook in one transaction each)"
manage place_order ada@example.com 1200
manage place_order grace@example.com 4550
manage place_order linus@example.com 999
echo "== queues before the worker runs"
manage alkstore stats
echo "== run the scheduler for 7 seconds (stock-report fires @every 2s)"
"$VENV/bin/python" manage.py runscheduler &
SCHED=$!
sleep 7
kill -TERM "$SCHED"; wait "$SCHED"
echo "== run a worker until the queues are drained"
manage runworker --burst
echo "== queues after"
manage alkstore stats
echo "== what the jobs did"
manage shop_report
