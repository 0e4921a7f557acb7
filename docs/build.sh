#!/usr/bin/env bash
# Build the documentation: bash docs/build.sh [extra sphinx-build arguments]
#
# Installs the `docs` extra of pyproject.toml into the current Python environment (the
# active virtualenv, or whatever `python` is), then builds the HTML into
# docs/_build/html with warnings as errors (-W --keep-going: every warning is listed,
# then the build fails). The notebooks are rendered with their stored outputs, not
# executed. Where cenlmc_jax is already importable (an editable install, CI's venv after
# `pip install ".[test]"`), only the extra's requirements are installed, so an editable
# install stays editable; the docs always document this checkout (docs/conf.py puts it
# first on sys.path).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"

if "$PYTHON" -c "import cenlmc_jax" >/dev/null 2>&1; then
  # the extra's requirement strings, read from pyproject.toml (tomllib: Python >= 3.11)
  mapfile -t reqs < <("$PYTHON" -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["docs"], sep="\n")')
  "$PYTHON" -m pip install -q "${reqs[@]}"
else
  "$PYTHON" -m pip install -q ".[docs]"
fi

# DOCS_BUILD_DIR: where to build (default docs/_build; another folder for a second build
# of the same checkout at the same time); html/ and doctrees/ are made fresh
OUT="${DOCS_BUILD_DIR:-docs/_build}"
rm -rf "$OUT/html" "$OUT/doctrees"
mkdir -p "$OUT"
"$PYTHON" -m sphinx -b html -W --keep-going -q -j auto -d "$OUT/doctrees" -w "$OUT/warnings.txt" \
  docs "$OUT/html" "$@"
echo "docs: $OUT/html/index.html"
