"""Shared test settings: tests run on the CPU and are deterministic (fixed seeds).

Compiled code is released after each test module. XLA's CPU backend maps
memory regions for every executable it keeps; a run of the whole suite in one
process compiles thousands of programs, and with the caches kept the process
reaches the kernel's limit on mapped regions (``vm.max_map_count``, 65,530 by
default) about two thirds of the way through, where LLVM aborts the process
(CI exit 134). Clearing JAX's caches between modules keeps it near 1,100.
"""

import gc
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402  (after JAX_PLATFORMS is set)
import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_code():
    yield
    jax.clear_caches()
    gc.collect()
