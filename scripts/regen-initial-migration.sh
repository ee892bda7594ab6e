#!/usr/bin/env bash
# Regenerates migrations/versions/0001_initial.py from lib/models.py.
# Only valid while no release has shipped; after that, add a new revision with
#   .venv/bin/alembic -c alembic.ini revision --autogenerate -m "what changed"
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
rm -f migrations/versions/0001_initial.py
.venv/bin/python - "$tmp" <<'PY'
import sys
from alembic import command
from lib.db import alembic_config, create_db_engine
engine = create_db_engine(f"sqlite:///{sys.argv[1]}/regen.db")
cfg = alembic_config(engine)
command.revision(cfg, message="initial schema", autogenerate=True, rev_id="0001")
PY
mv migrations/versions/0001_initial_schema.py migrations/versions/0001_initial.py
rm -rf "$tmp"
echo "regenerated migrations/versions/0001_initial.py"
