#!/usr/bin/env bash
# Build the documentation site into site/ (mkdocs.yml) and check the API reference against tli.__all__.
#
#   bash scripts/docs/build.sh
#
# Makes (once) a venv of its own, .venv-docs (or $TLI_DOCS_VENV), holding only the packages of the `docs` extra
# of pyproject.toml (mkdocs-material, mkdocstrings-python, mkdocs-jupyter, ...): the reference is read from
# src/ statically by griffe, so neither the package nor torch is installed. Then `mkdocs build --strict`
# (any warning fails: a broken `:::` reference, a dead link or anchor, a docstring section griffe cannot
# parse) and scripts/docs/check_reference.py (every public name rendered with its signature, typed
# parameters and errors). Needs Python >= 3.11 (tomllib reads the extra). CI runs this script (.ci/run).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
VENV=${TLI_DOCS_VENV:-$REPO/.venv-docs}
export NO_MKDOCS_2_WARNING=1 PIP_DISABLE_PIP_VERSION_CHECK=1

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
REQ=$(mktemp "${TMPDIR:-/tmp}/tli-docs-req.XXXXXX")
trap 'rm -f "$REQ"' EXIT
"$VENV/bin/python" - "$REQ" <<'PY'
import sys, tomllib
with open("pyproject.toml", "rb") as f:
    extra = tomllib.load(f)["project"]["optional-dependencies"]["docs"]
with open(sys.argv[1], "w", encoding="utf-8") as out:
    out.write("\n".join(extra) + "\n")
PY
"$VENV/bin/pip" install -q -r "$REQ" 2> >(grep -v "^WARNING: Location '.*' is ignored" >&2)
"$VENV/bin/mkdocs" build --strict
"$VENV/bin/python" scripts/docs/check_reference.py --site site
