"""The Pallas force kernel's default configurations compile for sm_90a without spilling
registers.

Needs the optional ``triton`` wheel (``pip install triton``; skipped
otherwise): the kernel's Triton IR is taken from the CUDA lowering (the
``__gpu$xla.gpu.triton`` custom call, with the ``num_warps`` / ``num_stages``
XLA would launch it with) and compiled for ``GPUTarget("cuda", 90, 32)``
with the wheel's own ptxas, whose ``-v`` log gives registers and spill bytes
(benchmarks/bench_spills.py, which also writes the table
benchmarks/results/spills.md). No GPU is used.

Configurations: the defaults of ``pallas.kernel_options`` (``KERNEL_DEFAULTS``)
for the CEnLMC kernel (w and the R2 count, HIGHEST precision, the distances of
``ensemble_force(method="pallas")``), float32 at d = 2, 3, 10 and 100 and the
block-sparse list kernel at d = 2, 3; float64 at d = 2 and 100. Slow: one
Triton compile per distinct kernel, 5-200 s each on a CPU (eight in all,
about 1.5-3 minutes on two cores).

The bound is 0 spilled bytes (a spill is a local-memory round trip inside
the innermost loop, and the table was chosen so that none occurs), except
where ``SPILL_BOUND`` states otherwise and why.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import jax.numpy as jnp
import pytest

pytest.importorskip(
    "triton",
    reason="the spill check compiles the kernel's Triton IR with the optional `triton` "
    "wheel (pip install triton): without it nothing here can compile for a GPU",
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_spills  # noqa: E402

from cenlmc_jax.pairwise import DIRECT_MAX_D, pallas  # noqa: E402

# one compile per distinct kernel (the sparse program also holds the dense kernel)
_USAGE: dict = {}


def usage(kernel: bench_spills.TritonKernel) -> dict:
    key = (
        hashlib.sha1(kernel.ttir.encode()).hexdigest(),
        kernel.num_warps,
        kernel.num_stages,
    )
    if key not in _USAGE:
        _USAGE[key] = bench_spills.compile_usage(kernel)
    return _USAGE[key]


#: Spill bytes per thread allowed: 0, except float64 at d = 100, whose 128-wide
#: float64 row tiles spill 132 bytes even at the smallest tiles tl.dot takes
#: (16 x 16; 4 and 16 warps spill more: pallas.KERNEL_DEFAULTS). 256 lets that
#: residual pass and fails a return to the earlier launch (4.9 KB there).
SPILL_BOUND = {("float64", 100): 256}


@pytest.mark.parametrize(
    "dtype, d, block_sparse",
    [
        ("float32", 2, False),
        ("float32", 3, False),
        ("float32", 10, False),
        ("float32", 100, False),
        ("float32", 2, True),
        ("float32", 3, True),
        ("float64", 2, False),
        ("float64", 100, False),
    ],
)
def test_default_kernel_does_not_spill(dtype, d, block_sparse):
    distances = "direct" if d <= DIRECT_MAX_D else "gram"
    opts = pallas.kernel_options(d, distances=distances, dtype=jnp.dtype(dtype))
    kernels = bench_spills.force_kernels(d, jnp.dtype(dtype), block_sparse=block_sparse)
    assert len(kernels) == (
        2 if block_sparse else 1
    )  # the list kernel and its dense fallback
    for kernel in kernels:
        # the table reaches the custom call XLA compiles
        assert (kernel.num_warps, kernel.num_stages) == (
            opts.num_warps,
            opts.num_stages,
        )
        got = usage(kernel)
        bound = SPILL_BOUND.get((dtype, d), 0)
        assert got["spill_stores"] <= bound and got["spill_loads"] <= bound, (
            dtype,
            d,
            block_sparse,
            opts,
            got,
        )
        assert got["registers"] <= 255, (
            got
        )  # ptxas's cap per thread: above it there is nothing but spilling
