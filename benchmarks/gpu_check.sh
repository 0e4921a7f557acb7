#!/usr/bin/env bash
# GPU check (benchmarks/gpu_check.py): headline force rows first, full cj.sample CEnLMC jobs, float64 correctness.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR] [extra gpu_check.py flags]
#
# OUT_DIR defaults to $OUT (the device tool's output folder), else benchmarks/results/gpu.
# 1. writes what is installed (installed_before.txt) before changing anything;
# 2. uses the machine's own python3 if its JAX has the GPU backend (any JAX >= 0.8 with
#    CUDA 12 or 13 plugins); else makes a venv on top of it (--system-site-packages) and
#    installs wheels carried in .whl/ (pip --no-index), else jax[cuda13] / jax[cuda12] by the
#    driver's CUDA version (needs a package index);
# 3. installs the library's own deps (optax, chex, scipy) into that venv if they are missing;
# 4. writes what the run uses (installed.txt, env.json) and runs gpu_check.py, which exits
#    with status 2 at once if jax.default_backend() is not the requested one.
# The run is capped at 8 minutes (timeout 470 s; the script's own budget 420 s); results
# are written after every section.
# CPU smoke run: GPU_CHECK_BACKEND=cpu bash benchmarks/gpu_check.sh /tmp/out --smoke
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-benchmarks/results/gpu}}"
shift || true
mkdir -p "$OUT_DIR"
PY="${PYTHON:-python3}"
BACKEND="${GPU_CHECK_BACKEND:-gpu}"
VENV="${GPU_CHECK_VENV:-/tmp/gpu_check_venv}"
PIP_OPTS=(-q --disable-pip-version-check --retries 0 --timeout 15)
export PYTHONUNBUFFERED=1

{
  echo "# before gpu_check.sh changed anything: $(date -u +%FT%TZ)"
  "$PY" --version
  "$PY" -m pip list --format=freeze 2>&1
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1
  nvidia-smi 2>&1 | grep -m1 "CUDA Version"
} > "$OUT_DIR/installed_before.txt" 2>&1

backend_of() { "$PY" -c 'import jax; print(jax.default_backend())' 2>/dev/null; }

use_venv() {
  if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv --system-site-packages "$VENV" || return 1
  fi
  PY="$VENV/bin/python"
}

if [ "$(backend_of)" != "$BACKEND" ] && [ "$BACKEND" = gpu ]; then
  echo "the machine's JAX has no GPU backend: installing one into $VENV"
  use_venv
  if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install "${PIP_OPTS[@]}" --no-index .whl/*.whl || echo "installing .whl/ failed"
  else
    cuda_major=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\).*/\1/p' | head -1)
    extra="cuda12"
    [ "${cuda_major:-0}" -ge 13 ] && extra="cuda13"
    "$PY" -m pip install "${PIP_OPTS[@]}" "jax[$extra]" || echo "pip install jax[$extra] failed"
  fi
fi
if ! "$PY" -c "import optax, chex, scipy" 2>/dev/null; then
  echo "installing the library's deps (optax, chex, scipy) into $VENV"
  use_venv
  if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install "${PIP_OPTS[@]}" --no-index --find-links .whl optax chex scipy || echo "deps from .whl/ failed"
  else
    "$PY" -m pip install "${PIP_OPTS[@]}" optax chex scipy || echo "pip install of the deps failed"
  fi
fi

# The package is pure Python: the repository on PYTHONPATH is enough.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
{
  echo "# what the run uses: $PY"
  "$PY" -m pip list --format=freeze 2>&1
  "$PY" -c "import jax; jax.print_environment_info()" 2>&1
} > "$OUT_DIR/installed.txt"
timeout 470 "$PY" benchmarks/gpu_check.py --out-dir "$OUT_DIR" --backend "$BACKEND" --budget-s 420 "$@" 2>&1 \
  | tee "$OUT_DIR/gpu_check.log"
status=${PIPESTATUS[0]}
echo "exit status $status; results in $OUT_DIR"
exit "$status"
