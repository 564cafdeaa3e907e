#!/usr/bin/env bash
# The test command: lint, migrations check, the install test (the built wheel in
# fresh venvs), then the suite on SQLite and on PostgreSQL, under the newest
# Django (Python 3.12+) and Django 5.2 LTS, and the Tasks tests under Django 6.0.
#
#   scripts/test.sh                 # everything
#   scripts/test.sh tests/unit -x   # extra arguments go to pytest
#
# ALKSTORE_DJANGOS="6 60 52" and ALKSTORE_ENGINES="sqlite postgresql" narrow a run;
# ALKSTORE_TEST_PG_DB names the PostgreSQL database (the suite uses test_<name>).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

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

make_venv() {  # make_venv DIR PYTHON DJANGO_SPEC
  local dir=$1 py=$2 spec=$3 stamp
  stamp="$dir/.alkstore-$(sha1sum pyproject.toml | cut -c1-12)-$(echo "$spec" | tr -c 'a-z0-9.' '_')"
  if [ ! -f "$stamp" ]; then
    echo "== preparing $dir ($spec, $("$py" --version))"
    "$py" -m venv "$dir"
    "$dir/bin/pip" install -q --disable-pip-version-check -e ".[dev]" "$spec" 2>&1 | grep -v '^WARNING: Location' || true
    "$dir/bin/python" -c 'import django, pytest_django' || { echo "install failed in $dir"; exit 1; }
    rm -f "$dir"/.alkstore-*; touch "$stamp"
  fi
}

DJANGOS=${ALKSTORE_DJANGOS:-"6 60 52"}
ENGINES=${ALKSTORE_ENGINES:-"sqlite postgresql"}
PG_DB=${ALKSTORE_TEST_PG_DB:-alkstore}
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

case " $ENGINES " in *" postgresql "*)
  if ! pg_isready -h 127.0.0.1 -p 5432 -q; then
    echo "== starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start
    for _ in $(seq 1 30); do pg_isready -h 127.0.0.1 -p 5432 -q && break; sleep 1; done
  fi ;;
esac

# The admin browser test drives Debian's chromium (Playwright cannot download a browser here).
command -v chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium; } >/dev/null 2>&1 \
  || echo "!! could not install chromium: the admin browser test will be skipped"

LINT_VENV=${VENVS[0]}
echo "== ruff check / ruff format --check"
"$LINT_VENV/bin/ruff" check .
"$LINT_VENV/bin/ruff" format --check .
echo "== mypy (django-stubs) and the import layers contract"
PYTHONPATH="$ROOT" "$LINT_VENV/bin/mypy" alkstore_django
PYTHONPATH="$ROOT" "$LINT_VENV/bin/lint-imports" --no-cache >/dev/null \
  || { PYTHONPATH="$ROOT" "$LINT_VENV/bin/lint-imports" --no-cache; exit 1; }

export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
FAILED=0
SUMMARY=()

run_pytest() {  # run_pytest LABEL VENV DATABASE_URL PYTEST_ARGS...
  local label=$1 venv=$2 url=$3 log status line
  shift 3
  echo "== pytest: $label"
  log=$(mktemp)
  set +e
  DATABASE_URL=$url "$venv/bin/python" -m pytest -q "$@" 2>&1 | tee "$log"
  status=${PIPESTATUS[0]}
  set -e
  line=$(grep -E '^[=]* ?[0-9]+ (passed|failed)|no tests ran' "$log" | tail -1)
  rm -f "$log"
  SUMMARY+=("$label: ${line:-no result} (exit $status)")
  if [ "$status" -ne 0 ]; then FAILED=1; fi
  case $line in *passed*) ;; *) FAILED=1;; esac
}

# The README's install step, proved once per full run: the wheel in fresh venvs,
# with and without the postgres extra, runs check, migrate and a job on SQLite.
if [ $# -eq 0 ]; then
  run_pytest "install test (fresh venvs)" "$LINT_VENV" "sqlite:///$ROOT/.test-db/${PG_DB}-install.sqlite3" \
    tests/test_packaging.py
fi

for venv in "${VENVS[@]}"; do
  # The fault-injection tier and the browser test exercise processes, signals
  # and the database, not Django's version: they run under the first (newest)
  # Django only, which keeps the whole command inside a few minutes. Django
  # 6.0 runs the Tasks tests only (unless told what to run): the rest does not
  # depend on 6.0 vs 6.1. The install test ran above, once.
  LIMIT=(--ignore=tests/test_packaging.py)
  if [ "$venv" = .venv-django60 ] && [ $# -eq 0 ]; then
    LIMIT+=(tests/tasks)
  elif [ "$venv" != "${VENVS[0]}" ]; then
    LIMIT+=(--ignore=tests/chaos --ignore=tests/browser)
  fi
  version=$("$venv/bin/python" -c 'import django; print(django.get_version())')
  echo "== makemigrations --check (Django $version)"
  DJANGO_SETTINGS_MODULE=tests.settings "$venv/bin/django-admin" makemigrations --check --dry-run >/dev/null \
    || { echo "!! missing migrations under Django $version"; FAILED=1; }
  for engine in $ENGINES; do
    if [ "$engine" = postgresql ]; then
      url="postgres://postgres@127.0.0.1:5432/$PG_DB"
    else
      url="sqlite:///$ROOT/.test-db/${PG_DB}-$(basename "$venv").sqlite3"
    fi
    run_pytest "Django $version / $engine" "$venv" "$url" "${LIMIT[@]}" "$@"
  done
done

echo
echo "== summary"
printf '%s\n' "${SUMMARY[@]}"
exit $FAILED
