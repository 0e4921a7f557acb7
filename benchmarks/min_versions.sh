#!/usr/bin/env bash
# The lower bounds stated in pyproject.toml, tested: a fresh virtualenv with every direct dependency
# (and every package of the test extra) pinned at its lower bound, then the fast test tier.
#
#   bash benchmarks/min_versions.sh [VENV_DIR] [PYTEST ARGS...]
#
# VENV_DIR defaults to $TMPDIR/cenlmc-min-venv (made afresh). PYTHON picks the interpreter (default
# python3.11, the lowest requires-python allows). The pins are passed as pip constraints to the
# ordinary install of ".[test]", so a pin that contradicts pyproject.toml (or a dependency's own
# requirements) fails the install rather than being skipped. Then the fast tier, `python -m pytest -q -n auto
# -m "not slow"`, or the pytest arguments given after VENV_DIR.
# Record a run in benchmarks/results/min_versions.md (the script prints the versions it installed).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3.11}"
VENV="${1:-${TMPDIR:-/tmp}/cenlmc-min-venv}"
shift || true

# The lower bounds (keep in step with pyproject.toml's dependencies and extras)
PINS=(
  "jax==0.8.0"          # jax.enable_x64, jax.shard_map
  "jaxlib==0.8.0"       # the jaxlib of jax 0.8.0 (jax pins it exactly)
  "optax==0.2.5"        # optax.lbfgs, optax.tree_utils.tree_norm
  "numpy==2.0.0"        # jax 0.8.0's lower bound
  "scipy==1.13.0"       # jax 0.8.0's lower bound
  "chex==0.1.87"        # the tests' chex.assert_max_traces (optax 0.2.5 needs >= 0.1.87)
  "tqdm==4.60.0"        # progress=True (tqdm.auto)
  "arviz==0.21.0"       # cj.to_arviz; 0.19-0.20 compute mcse_sd differently (cj.summary follows >= 0.21)
  "h5netcdf==1.8.2"     # run.nc with today's xarray (1.0-1.7 fail: "zlib" filter, Variable.filters)
  "h5py==3.11.0"        # run.nc; the first h5py built for numpy 2
  "matplotlib==3.8.4"   # cenlmc_jax.diagnostics.plots; the first matplotlib built for numpy 2
  "pytest==7.0.0"
  "pytest-timeout==2.1.0"
  "pytest-xdist==3.5.0"
  "lda==3.0.2"
  "numpyro==0.22.0"
)

rm -rf "$VENV"
"$PY" -m venv "$VENV"
. "$VENV/bin/activate"
python -m pip install -q --upgrade pip
CONSTRAINTS="$VENV/min-constraints.txt"
printf '%s\n' "${PINS[@]}" | sed 's/ *#.*//' > "$CONSTRAINTS"
python -m pip install -q ".[test]" -c "$CONSTRAINTS"
echo "== python $(python -c 'import sys; print(sys.version.split()[0])'); installed:"
python -m pip freeze | grep -i -E '^(jax|jaxlib|optax|numpy|scipy|chex|tqdm|arviz|h5netcdf|h5py|matplotlib|pytest|pytest-timeout|xarray|pandas|ml.dtypes)=='
if [ "$#" -gt 0 ]; then python -m pytest -q "$@"; else python -m pytest -q -n auto -m "not slow"; fi
