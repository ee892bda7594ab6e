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
# The test role only (never the product's): commits do not wait for the WAL flush (2-4 ms of fsync
# per writing commit on a VM disk, about 20 ms per PostgreSQL test; a crash of a test server loses
# nothing that matters), and its password is stored as a SCRAM verifier of 1 iteration instead of
# 4096, so each connection costs the client 1.5 instead of 5 CPU ms (the suite opens over a thousand;
# the password is 'overrule' anyway, and a wrong one is still refused).
su postgres -c "psql -qc 'ALTER ROLE overrule SET synchronous_commit = off'" >&2
python=$(dirname "$0")/../.venv/bin/python
[ -x "$python" ] || python=$(command -v python3 || true)
if [ -n "$python" ]; then
  verifier=$("$python" - <<'PY'
import base64, hashlib, hmac, os
salt, iterations = os.urandom(16), 1
salted = hashlib.pbkdf2_hmac("sha256", b"overrule", salt, iterations)
client_key = hmac.new(salted, b"Client Key", "sha256").digest()
server_key = hmac.new(salted, b"Server Key", "sha256").digest()
b64 = lambda b: base64.b64encode(b).decode()
print(f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(hashlib.sha256(client_key).digest())}:{b64(server_key)}")
PY
)
  printf "ALTER ROLE overrule PASSWORD '%s';\n" "$verifier" | su postgres -c "psql -q" >&2
fi
echo "postgresql://overrule:overrule@127.0.0.1:5432/postgres"
