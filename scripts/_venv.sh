# Sourced by scripts/run and scripts/test: a project venv with the given requirements installed.
# Reinstalls only when the requirements files change (a stamp holds their hash).

# uv installs the pinned set in a fifth of pip's time (a fresh venv from an empty cache on the 2-core
# CI machine: 24 s against pip's 116 s, the same versions), and that time comes out of the suite's
# 8-minute budget. pip remains the way in: it installs uv, and it installs everything itself when uv
# cannot be installed or cannot reach the index.
# No `--compile-bytecode`: it compiles all of site-packages (40 CPU s, 22 s of wall time on the CI
# machine), while the suite imports a part of it and each module is compiled once, on first import,
# and kept (scripts/test keeps bytecode): two test workers collecting at once cost 8 CPU s more
# than with everything compiled ahead (30 vs 22), an installed venv 1.7 CPU s instead of 41.
UV_PIN="uv==0.13.9"

install_requirements() {
  local req="$1"
  if .venv/bin/python -m pip install -q --disable-pip-version-check "$UV_PIN" \
    && .venv/bin/uv pip install -q --python .venv/bin/python -r "$req"; then
    return 0
  fi
  echo "uv could not install $req; installing with pip" >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check -r "$req"
}

ensure_venv() {
  local req="$1"
  if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
  fi
  local stamp=".venv/.stamp-$(basename "$req")"
  local want
  want=$(cat requirements*.txt | sha256sum | cut -d' ' -f1)
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    install_requirements "$req"
    echo "$want" > "$stamp"
  fi
}
