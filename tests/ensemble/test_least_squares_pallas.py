"""The Pallas kernel of the least-squares moments
(cenlmc_jax.ensemble.least_squares.pallas).

On CPU the kernel runs in Pallas' interpret mode (``interpret=None`` picks it
by the lowering platform), so the values are checked here against the XLA
references in float64; the Triton form is checked by lowering for CUDA, which
needs no GPU (as tests/pairwise/test_lowering.py: the Triton custom call present, the
interpreter, whose ops carry the kernel function's name ``_kernel`` in their
locations, absent).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cenlmc_jax.ensemble.least_squares import (
    least_squares_dense,
    least_squares_tiled,
    tile_moments,
)
from cenlmc_jax.ensemble.least_squares.pallas import (
    MAX_D,
    least_squares_moments_pallas,
    least_squares_pallas,
    xla_moments,
)

TRITON_CALL = "__gpu$xla.gpu.triton"
INTERPRETED = 'loc("_kernel"'
EPS = np.finfo(np.float64).eps
MIN_EIG = 0.05  # DEFAULT_MIN_EIG, the conditioning floor of every call here

S = jax.ShapeDtypeStruct


@pytest.fixture(autouse=True)
def _enable_x64():
    with jax.enable_x64(True):
        yield


@pytest.fixture(autouse=True)
def _h200(monkeypatch):
    # as tests/pairwise/test_lowering.py: newer JAX asks which GPU to lower for (JAX
    # 0.10 needs no device description)
    try:
        from jax._src.pallas.triton import gpu_info
    except ImportError:
        return
    h200 = gpu_info.get_gpu_info_from_version(gpu_info.GpuVersion.H200)
    monkeypatch.setattr(gpu_info, "get_gpu_info", lambda: h200)


def ensemble(n: int, d: int, seed: int = 0):
    """``n`` points uniform in ``[-1, 1]^d`` with a smooth non-polynomial ``f``; three
    invalid (NaN) particles."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(n, d))
    f = np.sin(x @ np.linspace(1.0, 2.0, d)) + 0.5 * np.sum(x * x, axis=1)
    x[3, 0] = np.nan
    f[7] = np.nan
    x[n - 1, d - 1] = np.inf
    return x, f


def prepared(x, f):
    valid = np.all(np.isfinite(x), axis=1) & np.isfinite(f)
    return jnp.where(valid[:, None], x, 0), jnp.where(valid, f, 0), jnp.asarray(valid)


def sum_bound(n: int, terms_max: np.ndarray) -> np.ndarray:
    # two orders of a sum of n terms differ by at most 2 (n-1) ε Σ|t| <= 2 n² ε max|t|
    # (recursive summation)
    return 2 * n * n * EPS * terms_max


CASES = [
    (d, quadratic, kernel)
    for d in (1, 2, 3)
    for quadratic in (False, True)
    for kernel in ("epanechnikov", "uniform")
]


@pytest.mark.parametrize("d, quadratic, kernel", CASES)
def test_matches_dense(d, quadratic, kernel):
    n = (75, 110, 150)[
        d - 1
    ]  # a multiple of neither tile (16 or 32): padded with invalid particles
    x, f = ensemble(n, d, seed=d)
    eta = 0.8
    blocks = (
        dict(block_rows=16, block_cols=32) if d == 2 else {}
    )  # d = 2: tiles other than the defaults
    got = least_squares_pallas(x, f, eta, quadratic=quadratic, kernel=kernel, **blocks)
    ref = least_squares_dense(x, f, eta, quadratic=quadratic, kernel=kernel)
    assert got.grad.dtype == jnp.float64 and got.cond.dtype == jnp.float64

    # the moments: the same terms (same ops, same masks) summed in another order
    xp, fp, valid = prepared(x, f)
    mo = least_squares_moments_pallas(
        xp, fp, valid, eta, kernel=kernel, quadratic=quadratic, **blocks
    )
    direct = tile_moments(
        xp,
        fp,
        valid,
        xp,
        fp,
        valid,
        jnp.float64(eta),
        kernel=kernel,
        quadratic=quadratic,
    )
    folded = xla_moments(
        xp,
        fp,
        valid,
        jnp.float64(eta),
        kernel=kernel,
        quadratic=quadratic,
        block_size=32,
    )
    df_max = float(np.ptp(fp[np.asarray(valid)]))
    # |k| <= 1 and |φ| <= 1 inside the ball: the terms of a are <= 1, of b <= |δf|, of c
    # <= δf², of m <= 1
    bounds = (1.0, max(1.0, df_max), max(1.0, df_max) ** 2, 1.0)
    for ref_mo in (direct, folded):
        for name, bound in zip(("a", "b", "c", "mass"), bounds, strict=True):
            np.testing.assert_allclose(
                getattr(mo, name),
                getattr(ref_mo, name),
                rtol=0,
                atol=sum_bound(n, bound),
                err_msg=name,
            )
        np.testing.assert_array_equal(mo.count, ref_mo.count)
    np.testing.assert_array_equal(
        mo.a, np.swapaxes(np.asarray(mo.a), 1, 2)
    )  # mirrored: exactly symmetric
    assert np.all(np.asarray(mo.count)[~np.asarray(valid)] == 0)

    # the gradient: ok and count exact; the solved fields to the moments' rounding times
    # the conditioning
    np.testing.assert_array_equal(got.count, ref.count)
    np.testing.assert_array_equal(got.ok, ref.ok)
    ok = np.asarray(ref.ok)
    assert (
        ok.sum() >= 10 and not ok[[3, 7, n - 1]].any()
    )  # particles fitted (>= 20% of them); the invalid refused
    # ok is compared exactly: no particle's conditioning within 1e-8 of the floor, far
    # above the ~1e-13 the moments' rounding can move it
    assert np.min(np.abs(np.asarray(ref.cond) - MIN_EIG)) > 1e-8
    # λ_min >= 0.05 and entries of A/m <= 1 (κ <= p/0.05 <= 180): a moment error ~1e-13
    # moves θ by < 1e-10
    np.testing.assert_allclose(got.cond, ref.cond, rtol=0, atol=1e-10)
    np.testing.assert_allclose(got.grad, ref.grad, rtol=1e-9, atol=1e-9 / eta)
    assert np.all(np.asarray(got.grad)[~ok] == 0)
    well = np.isfinite(np.asarray(ref.residual))
    np.testing.assert_array_equal(np.isfinite(np.asarray(got.residual)), well)
    # residual² = rss/η² with rss = c/m - θ·b/m: a difference, whose rounding is
    # relative to c/m
    c_over_m = np.asarray(direct.c) / np.maximum(np.asarray(direct.mass), 1e-300)
    np.testing.assert_allclose(
        np.asarray(got.residual)[well] ** 2,
        np.asarray(ref.residual)[well] ** 2,
        rtol=0,
        atol=1e-9 * np.max(c_over_m[well]) / eta**2,
    )


def test_float32_in_float32_out():
    x, f = ensemble(40, 2)
    with jax.enable_x64(False):
        got = least_squares_pallas(np.float32(x), np.float32(f), 1.5)
        ref = least_squares_dense(np.float32(x), np.float32(f), 1.5)
    assert got.grad.dtype == jnp.float32 and got.residual.dtype == jnp.float32
    np.testing.assert_array_equal(got.count, ref.count)
    ok = np.asarray(got.ok & ref.ok)
    assert ok.sum() > 20
    # float32 moments (ε 1.2e-7, 40 terms) through a solve with κ <= 40: 1e-4 relative
    np.testing.assert_allclose(
        np.asarray(got.grad)[ok], np.asarray(ref.grad)[ok], rtol=1e-4, atol=1e-4
    )


def test_vmap_over_ensembles():
    xs, fs = zip(*(ensemble(40, 2, seed=s) for s in (1, 2)), strict=True)
    batched = jax.vmap(lambda x, f: least_squares_pallas(x, f, 1.5))(
        jnp.stack(xs), jnp.stack(fs)
    )
    for i in range(2):
        one = least_squares_pallas(xs[i], fs[i], 1.5)
        np.testing.assert_array_equal(batched.ok[i], one.ok)
        # the same kernel on the same data: equal up to the batched program's own
        # rounding (float64)
        np.testing.assert_allclose(batched.grad[i], one.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("quadratic", [False, True])
def test_reverse_mode_matches_tiled(quadratic):
    # custom_vjp: the backward pass is the XLA fold's vjp, so jax.grad equals
    # least_squares_tiled's
    x, f = ensemble(40, 2, seed=5)
    weights = jnp.asarray(np.random.default_rng(6).normal(size=(40, 2)))

    def loss(method, x, f, eta):
        return jnp.sum(weights * method(x, f, eta, quadratic=quadratic).grad)

    x, f = (
        jnp.where(jnp.isfinite(x), x, 0.0),
        jnp.where(jnp.isfinite(f), f, 0.0),
    )  # finite: a gradient everywhere
    got = jax.grad(functools.partial(loss, least_squares_pallas), argnums=(0, 1, 2))(
        x, f, 1.5
    )
    ref = jax.grad(functools.partial(loss, least_squares_tiled), argnums=(0, 1, 2))(
        x, f, 1.5
    )
    for g, r in zip(got, ref, strict=True):
        # the same vjp with moments differing by ~1e-14 (summation order), through a
        # solve with κ <= 40
        np.testing.assert_allclose(
            g, r, rtol=1e-9, atol=1e-9 * float(np.max(np.abs(r)))
        )
    assert float(np.max(np.abs(got[0]))) > 0.1  # not a vacuous zero gradient


def test_forward_mode_raises():
    x, f = ensemble(40, 2)
    x, f = jnp.where(jnp.isfinite(x), x, 0.0), jnp.where(jnp.isfinite(f), f, 0.0)
    with pytest.raises(TypeError, match="custom_vjp"):
        jax.jvp(
            lambda x: least_squares_pallas(x, f, 1.5).grad, (x,), (jnp.ones_like(x),)
        )


def lower_text(fn, *shapes, platform: str = "cuda") -> str:
    return (
        jax.jit(fn)
        .trace(*shapes)
        .lower(lowering_platforms=(platform,))
        .as_text(debug_info=True)
    )


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("quadratic", [False, True])
def test_lowers_to_triton_for_cuda(dtype, quadratic):
    n, d = 1000, MAX_D[quadratic]  # the largest kernel of each fit

    def fn(x, f, eta):
        return least_squares_pallas(x, f, eta, quadratic=quadratic)

    text = lower_text(fn, S((n, d), dtype), S((n,), dtype), S((), dtype))
    assert text.count(TRITON_CALL) == 1 and INTERPRETED not in text
    n_pad = 1024
    assert (
        f"tensor<{n}x{n}" not in text and f"tensor<{n_pad}x{n_pad}" not in text
    )  # nothing N x N outside it


def test_interpret_follows_the_platform():
    shapes = S((300, 3), jnp.float64), S((300,), jnp.float64), S((), jnp.float64)

    def fn(interpret, x, f, eta):
        return least_squares_pallas(x, f, eta, interpret=interpret)

    cpu = lower_text(functools.partial(fn, None), *shapes, platform="cpu")
    assert INTERPRETED in cpu and TRITON_CALL not in cpu
    forced = lower_text(functools.partial(fn, True), *shapes, platform="cuda")
    assert INTERPRETED in forced and TRITON_CALL not in forced
    with pytest.raises(ValueError, match="interpret mode"):
        lower_text(functools.partial(fn, False), *shapes, platform="cpu")


@pytest.mark.parametrize("quadratic", [False, True])
def test_refuses_d_over_the_cap(quadratic):
    d = MAX_D[quadratic] + 1
    x = np.zeros((20, d))
    with pytest.raises(ValueError, match=rf"d must be <= {d - 1} .*got d = {d}"):
        least_squares_pallas(x, np.zeros(20), 1.0, quadratic=quadratic)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(block_rows=24), "block_rows must be a power of two >= 16.*got 24"),
        (dict(block_cols=8), "block_cols must be .*>= 16.*got 8"),
        (dict(block_rows=32.0), "block_rows must be an integer"),
        (dict(interpret="yes"), "interpret must be True or False"),
        (dict(kernel="gauss"), "kernel must be one of"),
        (dict(eta=-1.0), "eta"),
    ],
)
def test_bad_arguments(kwargs, match):
    kwargs = dict(dict(eta=1.0), **kwargs)
    with pytest.raises(ValueError, match=match):
        least_squares_pallas(np.zeros((20, 2)), np.zeros(20), **kwargs)


def test_moments_refuse_bad_shapes():
    x = jnp.zeros((20, 2))
    with pytest.raises(ValueError, match="valid bool"):
        least_squares_moments_pallas(
            x, jnp.zeros(20), jnp.ones(20), 1.0, kernel="uniform", quadratic=False
        )
    with pytest.raises(ValueError, match="x must be a floating array"):
        least_squares_moments_pallas(
            jnp.zeros(20),
            jnp.zeros(20),
            jnp.ones(20, bool),
            1.0,
            kernel="uniform",
            quadratic=False,
        )
