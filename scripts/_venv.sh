# Sourced by scripts/run and scripts/test: a project venv with the given requirements installed.
# Reinstalls only when the requirements files change (a stamp holds their hash).
ensure_venv() {
  local req="$1"
  if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
  fi
  local stamp=".venv/.stamp-$(basename "$req")"
  local want
  want=$(cat requirements*.txt | sha256sum | cut -d' ' -f1)
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    .venv/bin/python -m pip install -q --disable-pip-version-check -r "$req"
    echo "$want" > "$stamp"
  fi
}
