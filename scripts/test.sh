#!/usr/bin/env bash
# The test command: lint, migrations check, the install test (the built wheel in
# fresh venvs), then the suite on SQLite, PostgreSQL and MariaDB, and the
# PostgreSQL subset through PgBouncer in transaction mode, under the newest
# Django (Python 3.12+); Django 5.2 LTS runs SQLite and PostgreSQL (the
# engines' SQL does not depend on Django's version, the ORM glue does), and
# Django 6.0 the Tasks tests.
#
#   scripts/test.sh                 # everything
#   scripts/test.sh tests/unit -x   # extra arguments go to pytest
#
# ALKSTORE_DJANGOS="6 60 52" and ALKSTORE_ENGINES="sqlite postgresql mariadb pgbouncer"
# narrow a run; ALKSTORE_TEST_PG_DB names the PostgreSQL and MariaDB database
# (the suite uses test_<name>, and test_<name>_b through PgBouncer);
# ALKSTORE_PGBOUNCER_PORT is PgBouncer's port;
# ALKSTORE_PARALLEL=0 runs the engines in turn instead of in three lanes.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
# The suite's settings are pytest's (pyproject.toml) and its code is this
# checkout's: a DJANGO_SETTINGS_MODULE or PYTHONPATH left in the caller's
# shell (another project's, a benchmark's) would win over both.
unset DJANGO_SETTINGS_MODULE PYTHONPATH

find_python312() {
  local candidate
  for candidate in python3.14 python3.13 python3.12; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null; then
      command -v "$candidate"; return 0
    fi
  done
  if command -v pyenv >/dev/null 2>&1; then
    local root; root=$(pyenv root)
    for candidate in "$root"/versions/3.1[2-9]*/bin/python3; do
      if [ -x "$candidate" ]; then echo "$candidate"; return 0; fi
    done
  fi
  return 1
}

find_python311() {
  local candidate
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then
      command -v "$candidate"; return 0
    fi
  done
  return 1
}

# A venv is prepared in two steps so that the three can be prepared side by
# side (most of the time is downloads and mysqlclient's build): the project's
# dependencies, read from pyproject.toml, go in concurrently; the project
# itself goes in after, one venv at a time, because its editable build writes
# its egg-info into this checkout.
venv_stamp() {  # venv_stamp DIR DJANGO_SPEC
  echo "$1/.alkstore-$(sha1sum pyproject.toml | cut -c1-12)-$(echo "$2" | tr -c 'a-z0-9.' '_')"
}
project_requirements() {  # project_requirements PYTHON: the runtime, dev and mysql requirements, one a line
  "$1" - <<'PY'
import re
import tomllib

with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
self_reference = re.compile(re.escape(project["name"]) + r"\[(.*)\]")
wanted, seen, requirements = ["dev", "mysql"], set(), list(project["dependencies"])
while wanted:
    extra = wanted.pop()
    if extra not in seen:
        seen.add(extra)
        for requirement in project["optional-dependencies"][extra]:
            match = self_reference.fullmatch(requirement)
            if match:
                wanted.extend(match.group(1).split(","))
            else:
                requirements.append(requirement)
print("\n".join(requirements))
PY
}
prepare_venv() {  # prepare_venv DIR PYTHON DJANGO_SPEC: the dependencies (runs in the background)
  local dir=$1 py=$2 spec=$3
  "$py" -m venv "$dir" && project_requirements "$py" > "$dir/requirements.txt" \
    && "$dir/bin/pip" install -q --disable-pip-version-check -r "$dir/requirements.txt" "$spec"
}
PENDING_VENVS=()
make_venv() {  # make_venv DIR PYTHON DJANGO_SPEC: start preparing DIR unless it is ready
  local dir=$1 py=$2 spec=$3
  [ -f "$(venv_stamp "$dir" "$spec")" ] && return 0
  echo "== preparing $dir ($spec, $("$py" --version))"
  mkdir -p "$dir"
  prepare_venv "$dir" "$py" "$spec" > "$dir/prepare.log" 2>&1 &
  PENDING_VENVS+=("$!:$dir:$spec")
}
finish_venvs() {  # wait for the venvs being prepared, then install the project in each
  local entry pid dir spec
  for entry in ${PENDING_VENVS[@]+"${PENDING_VENVS[@]}"}; do
    IFS=: read -r pid dir spec <<< "$entry"
    if ! wait "$pid"; then
      grep -v '^WARNING: Location' "$dir/prepare.log"; echo "install failed in $dir"; exit 1
    fi
    "$dir/bin/pip" install -q --disable-pip-version-check --no-deps -e . 2>&1 | grep -v '^WARNING: Location' || true
    "$dir/bin/python" -c 'import alkstore_django, django, pytest_django' || { echo "install failed in $dir"; exit 1; }
    rm -f "$dir"/.alkstore-*; touch "$(venv_stamp "$dir" "$spec")"
  done
}

DJANGOS=${ALKSTORE_DJANGOS:-"6 60 52"}
ENGINES=${ALKSTORE_ENGINES:-"sqlite postgresql mariadb pgbouncer"}
PG_DB=${ALKSTORE_TEST_PG_DB:-alkstore}
PGBOUNCER_PORT=${ALKSTORE_PGBOUNCER_PORT:-6433}
# What runs through PgBouncer: the queue, worker, scheduler, admin, command
# and Tasks tests (the chaos tier restarts servers and the browser test only
# drives the admin, which the admin tests cover).
PGBOUNCER_TESTS=(tests/integration tests/admin tests/commands tests/concurrency tests/tasks tests/contract tests/pooler)
# Debian packages the engines need: mysqlclient builds against libmysqlclient.
apt_install() {  # apt_install PACKAGE...
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"; } >/dev/null 2>&1 \
    || { echo "!! could not install $*"; return 1; }
}
if ! pkg-config --exists mysqlclient 2>/dev/null || ! command -v cc >/dev/null 2>&1; then
  echo "== installing the mysqlclient build dependencies"
  apt_install default-libmysqlclient-dev build-essential pkg-config
fi
case " $ENGINES " in *" pgbouncer "*)
  command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || { echo "== installing pgbouncer"; apt_install pgbouncer; } ;;
esac
# The admin browser test drives Debian's chromium (Playwright cannot download a
# browser here). It installs while the venvs are prepared.
{ command -v chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium; } >/dev/null 2>&1 \
  || echo "!! could not install chromium: the admin browser test will be skipped"; } &
CHROMIUM_PID=$!
VENVS=()
for d in $DJANGOS; do
  case $d in
    6)
      if PY=$(find_python312); then
        make_venv .venv-django6 "$PY" "Django>=6.0,<6.2"; VENVS+=(.venv-django6)
      else
        echo "!! no Python 3.12+ found: running Django 5.2 LTS only (Django 6 needs Python 3.12+)"
        case " $DJANGOS " in *" 52 "*) ;; *) DJANGOS="$DJANGOS 52";; esac
      fi ;;
    60)
      # Django 6.0's @task takes no extra options: the Tasks tests pin what works there.
      if PY=$(find_python312); then
        make_venv .venv-django60 "$PY" "Django>=6.0,<6.1"; VENVS+=(.venv-django60)
      else
        echo "!! no Python 3.12+ found: skipping the Django 6.0 Tasks tests"
      fi ;;
    52)
      PY=$(find_python311) || { echo "no Python 3.11+ found"; exit 1; }
      make_venv .venv-django52 "$PY" "Django>=5.2,<5.3"; VENVS+=(.venv-django52) ;;
  esac
done
finish_venvs

case " $ENGINES " in *" postgresql "*|*" pgbouncer "*)
  if ! pg_isready -h 127.0.0.1 -p 5432 -q; then
    echo "== starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start
    for _ in $(seq 1 30); do pg_isready -h 127.0.0.1 -p 5432 -q && break; sleep 1; done
  fi ;;
esac

case " $ENGINES " in *" mariadb "*)
  if ! mysqladmin -h 127.0.0.1 -u root ping >/dev/null 2>&1; then
    echo "== starting MariaDB"
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql
    for _ in $(seq 1 30); do mysqladmin -h 127.0.0.1 -u root ping >/dev/null 2>&1 && break; sleep 1; done
  fi ;;
esac

# PgBouncer in transaction mode on its own port, in front of the local server:
# started here, stopped when this script exits. It runs as postgres (it
# refuses root) from a private directory.
PGB_DIR=""
RESULTS=$(mktemp -d /tmp/alkstore-test.XXXXXX)  # each run's summary line, and what failed
cleanup() {
  if [ -n "$PGB_DIR" ] && [ -f "$PGB_DIR/pgbouncer.pid" ]; then
    kill "$(cat "$PGB_DIR/pgbouncer.pid")" 2>/dev/null || true
  fi
  rm -rf "$RESULTS"
}
start_pgbouncer() {
  PGB_DIR=$(mktemp -d /tmp/alkstore-pgbouncer.XXXXXX)
  cat > "$PGB_DIR/pgbouncer.ini" <<INI
[databases]
* = host=127.0.0.1 port=5432
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PGBOUNCER_PORT
unix_socket_dir =
auth_type = trust
auth_file = $PGB_DIR/userlist.txt
admin_users = postgres
pool_mode = transaction
default_pool_size = 10
max_client_conn = 400
ignore_startup_parameters = extra_float_digits,options
logfile = $PGB_DIR/pgbouncer.log
pidfile = $PGB_DIR/pgbouncer.pid
INI
  echo '"postgres" ""' > "$PGB_DIR/userlist.txt"
  chown -R postgres "$PGB_DIR"
  /usr/sbin/pgbouncer -d -u postgres "$PGB_DIR/pgbouncer.ini"
  for _ in $(seq 1 30); do pg_isready -h 127.0.0.1 -p "$PGBOUNCER_PORT" -q && return 0; sleep 0.5; done
  echo "!! PgBouncer did not come up:"; cat "$PGB_DIR/pgbouncer.log"; return 1
}
trap cleanup EXIT
case " $ENGINES " in *" pgbouncer "*) echo "== starting PgBouncer (transaction mode) on port $PGBOUNCER_PORT"; start_pgbouncer ;; esac

wait "$CHROMIUM_PID" || true

LINT_VENV=${VENVS[0]}
echo "== ruff check / ruff format --check"
"$LINT_VENV/bin/ruff" check .
"$LINT_VENV/bin/ruff" format --check .
echo "== mypy (django-stubs) and the import layers contract"
PYTHONPATH="$ROOT" "$LINT_VENV/bin/mypy" alkstore_django
PYTHONPATH="$ROOT" "$LINT_VENV/bin/lint-imports" --no-cache >/dev/null \
  || { PYTHONPATH="$ROOT" "$LINT_VENV/bin/lint-imports" --no-cache; exit 1; }

export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

run_pytest() {  # run_pytest LABEL VENV DATABASE_URL PYTEST_ARGS...
  local label=$1 venv=$2 url=$3 log status line
  shift 3
  echo "== pytest: $label"
  log=$(mktemp)
  set +e
  DATABASE_URL=$url "$venv/bin/python" -m pytest -q "$@" 2>&1 | tee "$log"
  status=${PIPESTATUS[0]}
  set -e
  line=$(grep -E '^[=]* ?[0-9]+ (passed|failed)|no tests ran' "$log" | tail -1 || true)
  rm -f "$log"
  echo "$label: ${line:-no result} (exit $status)" >> "$RESULTS/summary"
  if [ "$status" -ne 0 ]; then echo "$label" >> "$RESULTS/failed"; fi
}

# The README's install step, proved once per full run: the wheel in fresh venvs,
# with and without the postgres extra, runs check, migrate and a job on SQLite.
if [ $# -eq 0 ]; then
  run_pytest "install test (fresh venvs)" "$LINT_VENV" "sqlite:///$ROOT/.test-db/${PG_DB}-install.sqlite3" \
    tests/test_packaging.py
fi
for venv in "${VENVS[@]}"; do
  version=$("$venv/bin/python" -c 'import django; print(django.get_version())')
  echo "== makemigrations --check (Django $version)"
  DJANGO_SETTINGS_MODULE=tests.settings "$venv/bin/django-admin" makemigrations --check --dry-run >/dev/null \
    || { echo "!! missing migrations under Django $version"; echo "migrations ($version)" >> "$RESULTS/failed"; }
done

engine_url() {  # engine_url ENGINE VENV: set url (and direct, behind the pooler) for a run
  direct=""
  case $1 in
    postgresql) url="postgres://postgres@127.0.0.1:5432/$PG_DB" ;;
    # A database of its own, so this run can share the server with the others.
    postgresql-queues) url="postgres://postgres@127.0.0.1:5432/${PG_DB}_q" ;;
    mariadb) url="mysql://root@127.0.0.1:3306/$PG_DB" ;;
    pgbouncer)
      url="postgres://postgres@127.0.0.1:$PGBOUNCER_PORT/${PG_DB}_b"
      direct="postgres://postgres@127.0.0.1:5432/${PG_DB}_b" ;;
    *) url="sqlite:///$ROOT/.test-db/${PG_DB}-$(basename "$2").sqlite3" ;;
  esac
  export DIRECT_DATABASE_URL=$direct
}

run_suites() {  # LANE_ENGINES=... run_suites PYTEST_ARGS...: each Django's suite on those engines in turn
  local venv engine newest version
  for venv in "${VENVS[@]}"; do
    # The fault-injection tier and the browser test exercise processes, signals
    # and the database, not Django's version: they run under the first (newest)
    # Django only. Django 6.0 runs the Tasks tests only (unless told what to
    # run): the rest does not depend on 6.0 vs 6.1. The install test ran above, once.
    LIMIT=(--ignore=tests/test_packaging.py)
    newest=1
    if [ "$venv" = .venv-django60 ] && [ $# -eq 0 ]; then
      LIMIT+=(tests/tasks); newest=0
    elif [ "$venv" != "${VENVS[0]}" ]; then
      LIMIT+=(--ignore=tests/chaos --ignore=tests/browser); newest=0
    elif [ "$CHAOS_APART" = 1 ]; then
      LIMIT+=(--ignore=tests/chaos)
    fi
    version=$("$venv/bin/python" -c 'import django; print(django.get_version())')
    for engine in $LANE_ENGINES; do
      # MariaDB and PgBouncer exercise the engines' SQL: the newest Django only.
      case $engine in mariadb|pgbouncer|postgresql-queues) [ "$newest" = 1 ] || continue ;; esac
      engine_url "$engine" "$venv"
      SELECT=("${LIMIT[@]}")
      # The browser test drives the admin's pages, whose queries the admin
      # tests run on every engine: a full run drives it on SQLite only (a
      # minute a run).
      if [ "$newest" = 1 ] && [ "$engine" != sqlite ] && [ $# -eq 0 ]; then
        SELECT+=(--ignore=tests/browser)
      fi
      if [ "$engine" = pgbouncer ] && [ $# -eq 0 ]; then
        SELECT=(--ignore=tests/test_packaging.py "${PGBOUNCER_TESTS[@]}")
      fi
      if [ "$engine" = postgresql-queues ]; then
        # alkstore on a database of its own beside the site's (the router, docs/scale.md):
        # the integration tier with every alkstore table on a second alias of this server.
        [ $# -eq 0 ] || continue
        ALKSTORE_TEST_QUEUE_DATABASE=1 run_pytest "Django $version / postgresql, alkstore on its own database" \
          "$venv" "$url" tests/integration
      else
        run_pytest "Django $version / $engine" "$venv" "$url" "${SELECT[@]}" "$@"
      fi
    done
  done
}

# Three lanes side by side, each a few runs one after another: PostgreSQL
# direct (each Django); PgBouncer and MariaDB; SQLite (each Django) and the run
# with alkstore on a database of its own. Every PostgreSQL run has a test
# database of its own on the one server (direct <name>, through PgBouncer
# <name>_b, alkstore's own <name>_q), and what a test does to other sessions
# it does in its own database only. Each run waits mostly on its server and its
# worker subprocesses (a pytest process uses about half a CPU), so on two CPUs
# the lanes take about the time of the longest. The first lane prints as it
# runs, the others' output follows it whole. The fault-injection tier judges
# timing under kills, stops and restarts (it restarts the servers): it runs
# after the lanes, its engines side by side, each on its own server.
# ALKSTORE_PARALLEL=0 runs everything in turn.
LANES=("" "" "")
for engine in $ENGINES; do
  case $engine in
    postgresql) LANES[0]="${LANES[0]} $engine"; LANES[2]="${LANES[2]} postgresql-queues" ;;
    pgbouncer|mariadb) LANES[1]="${LANES[1]} $engine" ;;
    *) LANES[2]=" $engine${LANES[2]}" ;;
  esac
done
BUSY_LANES=()
for lane in "${LANES[@]}"; do [ -n "$lane" ] && BUSY_LANES+=("$lane"); done
CHAOS_APART=0
if [ "${ALKSTORE_PARALLEL:-1}" = 0 ] || [ "${#BUSY_LANES[@]}" -lt 2 ]; then
  LANE_ENGINES="${LANES[*]}" run_suites "$@"
else
  [ $# -eq 0 ] && CHAOS_APART=1
  echo "== lanes side by side:$(printf ' [%s ]' "${BUSY_LANES[@]}") (the first's output below as it runs, the others' after)"
  lane_pids=()
  for index in "${!BUSY_LANES[@]}"; do
    if [ "$index" = 0 ]; then
      (LANE_ENGINES=${BUSY_LANES[0]}; run_suites "$@") &
    else
      (LANE_ENGINES=${BUSY_LANES[$index]}; run_suites "$@") > "$RESULTS/lane-$index.log" 2>&1 &
    fi
    lane_pids+=("$!")
  done
  for index in "${!lane_pids[@]}"; do
    wait "${lane_pids[$index]}" || echo "lane${BUSY_LANES[$index]}" >> "$RESULTS/failed"
    if [ "$index" != 0 ]; then
      echo "== lane:${BUSY_LANES[$index]}"; cat "$RESULTS/lane-$index.log"
    fi
  done
fi
if [ "$CHAOS_APART" = 1 ]; then
  # One run per engine, side by side: each restarts and starves only its own
  # server (SQLite has none), and each waits mostly on its kills and timers,
  # so together they take about the time of the longest (3.5 minutes here
  # against 8.6 one after another), with the same figures.
  version=$("$LINT_VENV/bin/python" -c 'import django; print(django.get_version())')
  chaos_pids=()
  for engine in $ENGINES; do
    [ "$engine" = pgbouncer ] && continue  # the pooler's subset has no chaos tier
    engine_url "$engine" "$LINT_VENV"
    run_pytest "Django $version / $engine, the fault-injection tier" "$LINT_VENV" "$url" tests/chaos \
      > "$RESULTS/chaos-$engine.log" 2>&1 &
    chaos_pids+=("$!:$engine")
  done
  for entry in "${chaos_pids[@]}"; do
    wait "${entry%%:*}" || echo "chaos ${entry#*:}" >> "$RESULTS/failed"
    cat "$RESULTS/chaos-${entry#*:}.log"
  done
fi

echo
echo "== summary"
cat "$RESULTS/summary" 2>/dev/null || true
if [ -s "$RESULTS/failed" ]; then
  echo "== failed:"; cat "$RESULTS/failed"; exit 1
fi
