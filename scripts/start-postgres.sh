#!/usr/bin/env bash
# Starts Debian's PostgreSQL for the test suite (installing it when missing) and prints the
# admin URL the tests use to create one database per test. Needs root (apt-get, pg_ctlcluster).
set -euo pipefail
if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
  echo "installing postgresql..." >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2 \
    || { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2; }
fi
version=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
if ! pg_lsclusters -h | grep -q "^$version main"; then
  pg_createcluster "$version" main >&2
fi
pg_ctlcluster "$version" main start >&2 2>/dev/null || true
for _ in $(seq 1 30); do
  pg_isready -q -h 127.0.0.1 -p 5432 && break
  sleep 1
done
su postgres -c "psql -qtAc \"DO \\\$\\\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'overrule') THEN
    CREATE ROLE overrule LOGIN SUPERUSER PASSWORD 'overrule';
  END IF; END \\\$\\\$;\"" >&2
echo "postgresql://overrule:overrule@127.0.0.1:5432/postgres"
