"""Shared test settings: tests run on the CPU and are deterministic (fixed seeds).

Compiled code is released after each test module. XLA's CPU backend maps
memory regions for every executable it keeps; a run of the whole suite in one
process compiles thousands of programs, and with the caches kept the process
reaches the kernel's limit on mapped regions (``vm.max_map_count``, 65,530 by
default) about two thirds of the way through, where LLVM aborts the process
(CI exit 134). Clearing JAX's caches between modules keeps it near 1,100.

Two tiers. CI runs every test (``python -m pytest -q``); the tests listed in
:data:`SLOW` (notebooks run at their small size, long statistical checks) are
marked ``slow`` here, by node-id prefix, so that a developer can skip them:
``python -m pytest -q -m "not slow"``. The marker is registered in
pyproject.toml, with the per-test ``timeout`` (pytest-timeout).
"""

import gc
import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")

# A persistent compilation cache for the test session (and the notebook kernels and CLI processes it
# starts, which inherit the environment): many tests compile the same program again (the same sampler
# on the same target in another test, another module after the caches are cleared, every CLI job,
# whose closures are new), and a cache hit loads it from disk instead. Measured on tests/test_cli.py
# (benchmarks/results/test_times.md). CENLMC_TEST_COMPILE_CACHE: "off" disables it, a folder keeps it
# across sessions (faster reruns while developing); unset, a fresh folder per session.
# One folder per pytest-xdist worker: JAX writes a cache entry without a lock (unless eviction is on), so
# a worker could read another's half-written entry.
_cache = os.environ.get("CENLMC_TEST_COMPILE_CACHE", "")
_ours = os.environ.get("CENLMC_TEST_CACHE_SET") == "1"  # set below in the controller, inherited by the workers
if _cache != "off" and (_ours or "JAX_COMPILATION_CACHE_DIR" not in os.environ):
    os.environ["CENLMC_TEST_CACHE_SET"] = "1"
    _worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    _cache = os.path.join(_cache, _worker) if _cache else tempfile.mkdtemp(prefix=f"cenlmc-test-xla-{_worker}-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import jax  # noqa: E402  (after JAX_PLATFORMS is set)
import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_code():
    yield
    jax.clear_caches()
    gc.collect()
    # float64 switched on globally by one module would change every later test in the worker (float32
    # tests then pass or fail by the order pytest-xdist happens to give): a module scopes it instead
    assert not jax.config.jax_enable_x64, "a test module left jax_enable_x64 on: use `with jax.enable_x64(True)`"


def pytest_collection_finish(session):
    if jax.config.jax_enable_x64:
        raise pytest.UsageError("a test module switched jax_enable_x64 on at import: scope it to its tests "
                                "(an autouse fixture `with jax.enable_x64(True): yield`)")


#: Node-id prefixes (relative to the repository root) of the tests marked ``slow``: the notebooks
#: run at their small size, and the long statistical tests whose property a shorter test of the
#: same module also exercises. Seconds: one run per test file, --durations, on the shared 2-core
#: CPU at a load of 5-7 (so 2-3x an idle machine's); the whole suite took ~77 min there, these ~16.
SLOW = (
    "tests/test_notebooks.py::test_notebook_runs_at_small_size",  # 5 notebooks, 516 s (151 the longest)
    # CEnLMC's second moment within 4 MCSE of LMC's at N = 2000, d = 5 and 10: 169 s
    "tests/test_ensemble.py::test_guard_keeps_moments_within_mcse_of_lmc_where_the_ball_is_empty",
    # Theorem 3.3's coupling distance along a grid of radii and N: 54 s
    "tests/test_ensemble.py::test_coupling_distance_shrinks_with_smaller_radii_and_more_particles",
    # the tuner's fraction reached and reproduced by fresh runs, N = 1000: 70 s
    "tests/test_ensemble_tuning.py::test_tuner_reaches_the_fraction_and_a_fresh_run_reproduces_it",
    # adapted chains' moments by z-scores (Gaussian; logistic against its reference): 73 s and 53 s
    "tests/test_adaptation.py::test_adapted_chains_have_the_gaussian_moments",
    "tests/test_adaptation.py::test_adapted_chains_on_a_dict_position_have_the_logistic_posterior_moments",
    # both gradient modes give the same samples (ensembles; MALA): ~35 s each at load 12
    "tests/test_grad_mode.py::test_ensemble_samplers",
    "tests/test_grad_mode.py::test_mala_same_samples",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith(SLOW):
            item.add_marker(pytest.mark.slow)
