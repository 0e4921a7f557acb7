#!/usr/bin/env bash
# GPU check of the ensemble force (correctness vs float64, pairs/s, block-sparse vs dense tiles, a CEnLMC step).
#
#   bash benchmarks/gpu_check.sh [OUT_DIR] [extra gpu_check.py flags, e.g. --quick]
#
# OUT_DIR defaults to $OUT (the device tool's output folder), else
# benchmarks/results/gpu. Meant for a bare CUDA machine without internet:
# it uses the machine's own python3 if that already has a GPU-enabled JAX;
# else it installs wheels carried in .whl/ (pip --no-index); else, as a last
# resort, it tries `pip install jax[cuda12]` (needs a package index).
# CPU smoke run: GPU_CHECK_NO_INSTALL=1 PYTHON=... bash benchmarks/gpu_check.sh /tmp/out --quick
# The whole run is capped at 8 minutes (timeout 470 s, the script's own
# budget 420 s): it writes gpu_check.json / .md after every section, so a run
# cut short still leaves its results.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-benchmarks/results/gpu}}"
shift || true
mkdir -p "$OUT_DIR"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1

has_gpu_jax() {
  "$PY" - <<'PYEOF' 2>/dev/null
import jax, sys
sys.exit(0 if jax.default_backend() == "gpu" else 1)
PYEOF
}

# GPU_CHECK_NO_INSTALL=1 skips all installing (a CPU smoke run: --quick).
if [ "${GPU_CHECK_NO_INSTALL:-0}" != 1 ] && ! has_gpu_jax; then
  if compgen -G ".whl/*.whl" >/dev/null; then
    echo "installing carried wheels from .whl/"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  else
    echo "no GPU JAX found and no .whl/ folder: trying pip (needs a package index)"
    "$PY" -m pip install -q "jax[cuda12]" || echo "pip install failed"
  fi
fi
# The package is pure Python: the repository on PYTHONPATH is enough.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import jax; print('jax', jax.__version__, jax.devices())" 2>&1 | tee "$OUT_DIR/env.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv 2>&1 | tee -a "$OUT_DIR/env.txt" || true
timeout 470 "$PY" benchmarks/gpu_check.py --out-dir "$OUT_DIR" --budget-s 420 "$@" 2>&1 | tee "$OUT_DIR/gpu_check.log"
echo "exit status ${PIPESTATUS[0]}; results in $OUT_DIR"
