"""Every program ``method="auto"`` (and ``"pallas"``) can pick lowers for CUDA, on a
CPU-only machine.

No GPU is needed to *lower* for one: ``jax.jit(fn).trace(*shapes).lower(
lowering_platforms=("cuda",))`` runs JAX's CUDA lowering rules, and for
Pallas the whole Pallas -> Triton-IR translation (where unsupported ops,
non-power-of-two tiles and bad ``tl.dot`` shapes are rejected). Nothing is
compiled (no ptxas, no XLA GPU passes), so the file stays fast; the compile
of the Triton IR to sm_90a is tests/pairwise/test_pallas_spills.py's business.

The lowering matrix (docs of ``pairwise.ensemble_force``):

    program                       how it is picked
                                    checked here
    dense N x N                   auto, N <= 64
                                    test_force_lowers[dense]
    tiled                         auto, otherwise
                                    test_force_lowers[tiled]
    tiled block-sparse            auto, d <= 3 & N >= 8192, ...
                                    test_force_lowers[tiled_sparse]
    Pallas / Pallas block-sparse  method="pallas" (+ block_sparse)
                                    test_force_lowers[pallas*]
    sharded (allgather, ring)     mesh=, tiled or Pallas partials
                                    test_sharded_force_lowers
    cenlmc_step, lmc_step         the samplers' steps
                                    test_steps_lower
    cj.sample chunk               run._chunk_fn of cj.cenlmc
                                    test_sample_chunk_lowers

For Pallas each lowering must hold the Triton custom call and no
interpreter: the interpreted kernel is inlined as StableHLO whose locations
name the kernel function (``_kernel``), while the Triton kernel is an opaque
bytecode attribute of the custom call. ``interpret=None`` is resolved by the
lowering platform (``lax.platform_dependent``): the same call lowered for the
CPU holds the interpreter and no Triton call (test_interpret_follows_the_platform).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

import cenlmc_jax as cj
from cenlmc_jax import run
from cenlmc_jax.pairwise import auto_block_sparse, ensemble_force, ensemble_force_pallas

TRITON_CALL = "__gpu$xla.gpu.triton"
INTERPRETED = 'loc("_kernel"'  # the Pallas kernel's own ops, inlined: interpret mode

S = jax.ShapeDtypeStruct


@pytest.fixture(autouse=True)
def _h200(monkeypatch):
    # Newer JAX asks which GPU to lower for: answer "an H200" when that hook
    # exists (JAX 0.10 needs no device description).
    try:
        from jax._src.pallas.triton import gpu_info
    except ImportError:
        return
    h200 = gpu_info.get_gpu_info_from_version(gpu_info.GpuVersion.H200)
    monkeypatch.setattr(gpu_info, "get_gpu_info", lambda: h200)


def pair_shapes(n: int, d: int):
    vec, mat, scalar = S((n,), jnp.float32), S((n, d), jnp.float32), S((), jnp.float32)
    return mat, vec, vec, scalar, mat, scalar  # x, f, log_p, eta, w, r2


def lower_text(fn, *shapes, platform: str = "cuda") -> str:
    return (
        jax.jit(fn)
        .trace(*shapes)
        .lower(lowering_platforms=(platform,))
        .as_text(debug_info=True)
    )


def assert_triton(text: str, count: int | None = None):
    assert TRITON_CALL in text, (
        "no Triton custom call: the Pallas kernel was not lowered for CUDA"
    )
    assert INTERPRETED not in text, (
        "the Pallas interpreter is embedded in a CUDA lowering"
    )
    if count is not None:
        assert text.count(TRITON_CALL) == count


def assert_xla_only(text: str):
    assert TRITON_CALL not in text and INTERPRETED not in text


# (name, n, d, keywords of ensemble_force, Triton calls expected: None = XLA only)
FORCES = [
    ("dense", 64, 2, dict(method="auto"), None),
    ("tiled", 1000, 10, dict(method="auto"), None),
    ("tiled_sparse", 8192, 2, dict(method="auto"), None),
    ("pallas", 1000, 10, dict(method="pallas"), 1),
    ("pallas_gram", 1000, 100, dict(method="pallas"), 1),
    # the sparse kernel alone: the other branch of its cond (a list that overflows) is
    # the block-sparse XLA tiles, not a second, dense kernel
    ("pallas_sparse", 8192, 2, dict(method="pallas", block_sparse=True), 1),
]


def test_matrix_covers_auto():
    # the auto rule picks the dense reference, tiles and block-sparse tiles at these
    # shapes
    assert not auto_block_sparse(1000, 10) and auto_block_sparse(8192, 2)


@pytest.mark.parametrize(
    "name, n, d, kwargs, calls", FORCES, ids=[c[0] for c in FORCES]
)
def test_force_lowers(name, n, d, kwargs, calls):
    def force(x, f, log_p, eta, w, r2):
        return ensemble_force(x, f, log_p, eta, w=w, r2=r2, **kwargs)

    text = lower_text(force, *pair_shapes(n, d))
    if calls is None:
        assert_xla_only(text)
        if name == "dense":  # the (N, N, d) difference array: the dense reference it is
            assert f"tensor<{n}x{n}x{d}xf32>" in text
        # the Hilbert sort of the particles: only the block-sparse tiles have one
        assert ("stablehlo.sort" in text) == (name == "tiled_sparse")
    else:
        assert_triton(text, calls)


def test_interpret_follows_the_platform():
    shapes = pair_shapes(300, 3)

    def force(interpret, x, f, log_p, eta, w, r2):
        return ensemble_force_pallas(x, f, log_p, eta, w=w, r2=r2, interpret=interpret)

    # None: decided by the lowering platform, not by jax.default_backend() (cpu here)
    assert_triton(
        lower_text(functools.partial(force, None), *shapes, platform="cuda"), 1
    )
    cpu = lower_text(functools.partial(force, None), *shapes, platform="cpu")
    assert INTERPRETED in cpu and TRITON_CALL not in cpu
    # True: the interpreter everywhere, also in a CUDA lowering (a debugging aid)
    cuda_interpreted = lower_text(
        functools.partial(force, True), *shapes, platform="cuda"
    )
    assert INTERPRETED in cuda_interpreted and TRITON_CALL not in cuda_interpreted
    # False: always Triton, which the CPU cannot lower
    assert_triton(
        lower_text(functools.partial(force, False), *shapes, platform="cuda"), 1
    )
    with pytest.raises(ValueError, match="interpret mode"):
        lower_text(functools.partial(force, False), *shapes, platform="cpu")
    with pytest.raises(ValueError, match="interpret"):
        ensemble_force(
            *(jnp.zeros(s.shape) for s in shapes[:3]),
            1.0,
            method="pallas",
            interpret="yes",
        )


@pytest.mark.parametrize(
    "method, strategy",
    [("tiled", "allgather"), ("tiled", "ring"), ("pallas", "allgather")],
)
def test_sharded_force_lowers(method, strategy):
    # An abstract 8-device mesh: lowering needs no devices, only the mesh's shape.
    mesh = jax.sharding.AbstractMesh((8,), ("particles",))
    n, d = 1024, 10

    def force(x, f, log_p, eta, w, r2):
        return ensemble_force(
            x, f, log_p, eta, w=w, r2=r2, method=method, mesh=mesh, strategy=strategy
        )

    text = lower_text(force, *pair_shapes(n, d))
    assert (
        'sdy.mesh @mesh = <["particles"=8]>' in text
        and "sdy.manual_computation" in text
    )
    assert f"tensor<{n // 8}x{d}xf32>" in text  # each device's own rows
    assert ("all_gather" if strategy == "allgather" else "collective_permute") in text
    if method == "pallas":
        assert_triton(text, 1)
    else:
        assert_xla_only(text)


def gaussian(x):
    return -0.5 * jnp.sum(x * x)


def cenlmc(n: int, d: int, **options):
    h = 0.05
    eta = r2 = float((h * d) ** 0.5)
    return cj.cenlmc(gaussian, h, eta, 0.5, r2, 4, 10.0, f_star=0.0, **options)


def state_shapes(algorithm, n: int, d: int):
    return jax.eval_shape(algorithm.init, S((n, d), jnp.float32))


KEY = S((), jax.random.key(0).dtype)


@pytest.mark.parametrize("program", ["cenlmc_auto", "cenlmc_pallas", "lmc"])
def test_steps_lower(program):
    n, d = 1000, 10
    if program == "lmc":
        algorithm = cj.lmc(gaussian, 0.05)
    else:
        algorithm = cenlmc(
            n, d, method="pallas" if program == "cenlmc_pallas" else "auto"
        )
    text = lower_text(algorithm.step, KEY, state_shapes(algorithm, n, d))
    if program == "cenlmc_pallas":
        assert_triton(text, 1)
    else:
        assert_xla_only(text)


@pytest.mark.parametrize("method", ["auto", "pallas"])
def test_sample_chunk_lowers(method):
    # The driver's jitted chunk (what cj.sample runs): 2 recorded steps of
    # CEnLMC at a block-sparse shape (auto: sparse tiles; pallas: sparse kernel).
    n, d = 8192, 2
    algorithm = cenlmc(n, d, method=method, block_sparse=True)
    chunk = run._chunk_fn(algorithm.step, 2, 1, "trace", lambda s: s.position, "mean")
    lowered = chunk.trace(KEY, state_shapes(algorithm, n, d), None, 0, 2, True).lower(
        lowering_platforms=("cuda",)
    )
    text = lowered.as_text(debug_info=True)
    if method == "pallas":
        # the sparse kernel, once in the scanned step (its overflow branch is the
        # block-sparse XLA tiles)
        assert_triton(text, 1)
    else:
        assert_xla_only(text)


def test_gpu_check_refuses_another_backend(tmp_path):
    # benchmarks/gpu_check.py must not time the Pallas interpreter on a CPU
    # when a GPU was asked for (a failed CUDA install): status 2 before any
    # work, with env.json saying what it found. (Its CPU smoke run,
    # --smoke --backend cpu, takes 1-3 minutes: not part of this file.)
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import gpu_check

    assert jax.default_backend() == "cpu"
    assert gpu_check.main(["--smoke", "--out-dir", str(tmp_path)]) == 2
    assert (tmp_path / "env.json").exists() and not (
        tmp_path / "gpu_check.json"
    ).exists()
