"""Preconditioned LMC, ``cj.lmc(..., inverse_mass_matrix=M)``, against the exact
stationary law on Gaussians.

On ``π = N(0, Σ)`` the step ``x' = x + h M ∇log π(x) + sqrt(2h) M^{1/2} ξ`` is linear:
``x' = A x + sqrt(2h) M^{1/2} ξ`` with ``A = I - h M Σ⁻¹``, so the stationary covariance
``S`` is the solution of the discrete Lyapunov equation ``S = A S Aᵀ + 2h M`` (a linear
system, solved exactly here), and ``M = Σ`` gives ``S = Σ / (1 - h/2)`` whatever the
condition number of ``Σ``.

Statistics: particle i's time average of ``g(x_i)`` is one number; the particles are
independent chains, so the N averages are i.i.d. and their sd / sqrt(N) is the exact
standard error of their mean (no autocorrelation estimate). |z| < 4 per entry: a false
alarm has probability 6e-5 per check.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cenlmc_jax as cj

Z_MAX = 4.0


def lyapunov(A, Q):
    """S solving S = A S Aᵀ + Q (vectorised: (I - A⊗A) vec S = vec Q)."""
    d = A.shape[0]
    return np.linalg.solve(np.eye(d * d) - np.kron(A, A), Q.reshape(-1)).reshape(d, d)


def rotation(d, seed):
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(d, d)))
    return q


def gaussian(cov):
    prec = jnp.asarray(np.linalg.inv(cov))
    return lambda x: -0.5 * x @ prec.astype(x.dtype) @ x


def dense_case():
    """d = 3, condition number 1e4, M = Σ^{1/2} B Σ^{1/2} with B's eigenvalues in [0.5,
    2]: M Σ⁻¹ has the eigenvalues of B, so A = I - h M Σ⁻¹ contracts by 1 - h·0.5 per
    step at worst (h = 0.2: 10 steps)."""
    r = rotation(3, 0)
    cov = r @ np.diag([1e2, 1.0, 1e-2]) @ r.T
    root = cj.langevin.mass_root(cov)
    b = rotation(3, 1) @ np.diag([0.5, 1.0, 2.0]) @ rotation(3, 1).T
    return cov, root @ b @ root


def diagonal_case():
    cov = np.diag([1e2, 1e-2])
    return cov, np.array([50.0, 0.02])  # M Σ⁻¹ = diag(0.5, 2)


def scalar_case():
    cov = np.array([[1.0, 0.3], [0.3, 0.5]])
    return cov, 0.7


CASES = {"dense": dense_case, "diagonal": diagonal_case, "scalar": scalar_case}


def run(
    logdensity_fn,
    cov,
    M,
    h,
    key,
    n=1000,
    steps=600,
    burn_in=100,
    thin=2,
    dtype=jnp.float32,
):
    d = cov.shape[0]
    x0 = jnp.asarray(
        np.random.default_rng(2).normal(size=(n, d)) @ np.linalg.cholesky(cov).T, dtype
    )
    algo = cj.lmc(logdensity_fn, h, inverse_mass_matrix=M)
    # check_convergence=False: each particle is a short chain (R-hat asks each for ~50
    # effective draws per half, measured 1.02-1.05 here); the z-tests pool the N
    # independent particles, which is what is checked
    return cj.sample(
        key,
        algo,
        algo.init(x0),
        steps,
        thin=thin,
        burn_in=burn_in,
        check_convergence=False,
    )


def second_moment_z(trace, exact):
    """z-scores of the mean of x xᵀ (the mean 0 is exact) against ``exact``,
    entrywise."""
    t = np.asarray(trace, np.float64)
    per = (t[..., :, None] * t[..., None, :]).mean(
        axis=0
    )  # (N, d, d) per-particle time averages
    se = per.std(axis=0, ddof=1) / math.sqrt(per.shape[0])
    return (per.mean(axis=0) - exact) / se, se


@pytest.mark.parametrize("form", sorted(CASES))
def test_stationary_covariance_is_the_lyapunov_solution(form):
    """Each matrix form of M: the covariance and the mean of the run are the exact ULA
    law's, and the law differs from Σ by more than the test resolves (the test would see
    a missing M^{1/2} or h M)."""
    cov, M = CASES[form]()
    h = 0.2
    res = run(gaussian(cov), cov, M, h, jax.random.key(10))
    assert res.diverged_at == -1
    d = cov.shape[0]
    m = cj._linalg.constant_dense(M, d)
    A = np.eye(d) - h * m @ np.linalg.inv(cov)
    exact = lyapunov(A, 2 * h * m)
    z, se = second_moment_z(res.trace, exact)
    assert np.all(np.abs(z) < Z_MAX), (z, exact)
    per_mean = np.asarray(res.trace, np.float64).mean(axis=0)
    z_mean = per_mean.mean(axis=0) / (
        per_mean.std(axis=0, ddof=1) / math.sqrt(per_mean.shape[0])
    )
    assert np.all(np.abs(z_mean) < Z_MAX), z_mean
    assert (
        np.max(np.abs(exact - cov) / se) > 10.0
    )  # the bias is resolved: h = 0.2 is not small here


def test_mass_equal_to_the_covariance_gives_the_isotropic_bias_at_condition_number_1e4():  # noqa: E501
    """M = Σ: S = Σ/(1 - h/2) exactly (algebra), and the run has it (float64: the small
    direction's variance is 1e-4 of the large one's)."""
    r = rotation(2, 3)
    cov = r @ np.diag([1e2, 1e-2]) @ r.T
    h = 0.1
    A = np.eye(2) - h * np.eye(2)  # M Σ⁻¹ = I
    np.testing.assert_allclose(lyapunov(A, 2 * h * cov), cov / (1 - h / 2), rtol=1e-12)
    with jax.enable_x64(True):
        res = run(
            gaussian(cov),
            cov,
            cov,
            h,
            jax.random.key(11),
            dtype=jnp.float64,
            steps=400,
            burn_in=60,
        )
    z, _ = second_moment_z(res.trace, cov / (1 - h / 2))
    assert np.all(np.abs(z) < Z_MAX), z
    # plain LMC at the curvature rule for the same bias barely moves in the wide
    # direction: h = 2·0.05/(1.05·1e2) ≈ 1e-3, relaxation time 1e5 steps in the
    # direction of variance 1e2
    h_plain = cj.adaptation.langevin_step_size(1e2, bias=0.05)
    x0 = jnp.zeros((200, 2))
    plain = cj.sample(
        jax.random.key(12),
        cj.lmc(gaussian(cov), h_plain),
        cj.ensemble.lmc_init(x0, gaussian(cov)),
        400,
        check_convergence=False,
    )
    wide = r[:, 0]
    spread = float(np.var(np.asarray(plain.state.position) @ wide))
    assert spread < 0.02 * 1e2, spread  # ≈ 2·h·400 = 0.8 of the target's 100


def test_identity_mass_is_plain_lmc_and_same_key_same_samples():
    """M = I in every form gives plain LMC's chain (the same ξ); the same key gives the
    same samples."""
    cov, M = dense_case()
    logp = gaussian(cov)
    x0 = jax.random.normal(jax.random.key(0), (20, 3))
    plain = cj.sample(
        jax.random.key(5),
        cj.lmc(logp, 0.05),
        cj.ensemble.lmc_init(x0, logp),
        5,
        check_convergence=False,
    )
    for eye in (1.0, np.ones(3), np.eye(3)):
        algo = cj.lmc(logp, 0.05, inverse_mass_matrix=eye)
        pre = cj.sample(
            jax.random.key(5), algo, algo.init(x0), 5, check_convergence=False
        )
        np.testing.assert_allclose(pre.trace, plain.trace, rtol=1e-5, atol=1e-6)
    algo = cj.lmc(logp, 0.05, inverse_mass_matrix=M)
    a = cj.sample(jax.random.key(6), algo, algo.init(x0), 5, check_convergence=False)
    b = cj.sample(jax.random.key(6), algo, algo.init(x0), 5, check_convergence=False)
    np.testing.assert_array_equal(a.trace, b.trace)


def test_float64_in_float64_out_jit_and_the_free_step_agree():
    cov, M = dense_case()
    logp = gaussian(cov)
    with jax.enable_x64(True):
        x0 = jnp.zeros((8, 3), jnp.float64)
        state = cj.ensemble.lmc_init(x0, logp)
        eager, _ = cj.ensemble.lmc_step(
            jax.random.key(1), state, logp, 0.1, inverse_mass_matrix=M
        )
        step = functools.partial(
            cj.ensemble.lmc_step,
            logdensity_fn=logp,
            step_size=0.1,
            inverse_mass_matrix=M,
        )
        jitted, _ = jax.jit(step)(jax.random.key(1), state)
        assert (
            eager.position.dtype == jnp.float64 and jitted.position.dtype == jnp.float64
        )
        np.testing.assert_allclose(
            eager.position, jitted.position, rtol=1e-12, atol=1e-12
        )
        algo = cj.lmc(logp, 0.1, inverse_mass_matrix=M)
        obj, _ = algo.step(jax.random.key(1), state)
        np.testing.assert_allclose(obj.position, eager.position, rtol=1e-12, atol=1e-12)
        # the step is x + h M g + sqrt(2h) M^{1/2} ξ with ξ the plain step's draw
        xi = jax.random.normal(jax.random.key(1), (8, 3), jnp.float64)
        root = cj.langevin.mass_root(M)
        expected = (
            0.1 * np.asarray(state.logdensity_grad) @ M
            + math.sqrt(0.2) * np.asarray(xi) @ root
        )
        np.testing.assert_allclose(eager.position, expected, rtol=1e-10, atol=1e-12)


def test_grad_through_sample_is_the_exact_pathwise_derivative():
    """log π = -(x - μ1)ᵀ Σ⁻¹ (x - μ1)/2 with a scalar shift μ: from a fixed x0, x_t =
    μ1 + A^t (x0 - μ1) + noise, so d x_t / dμ = (I - A^t) 1 exactly, and the streamed
    mean over t = 1..T of coordinate 0 has the derivative mean_t [(I - A^t) 1]_0,
    whatever the noise."""
    cov, M = dense_case()
    prec = np.linalg.inv(cov)
    h, T = 0.1, 12
    with jax.enable_x64(True):
        x0 = jax.random.normal(jax.random.key(0), (16, 3), jnp.float64)

        def streamed_mean(mu):
            logp = lambda x: -0.5 * (x - mu) @ jnp.asarray(prec) @ (x - mu)  # noqa: E731
            algo = cj.lmc(logp, h, inverse_mass_matrix=M)
            res = cj.sample(
                jax.random.key(3),
                algo,
                algo.init(x0),
                T,
                mode="stream",
                check_convergence=False,
            )
            return res.moments.mean[0]

        got = float(jax.grad(streamed_mean)(0.4))
    A = np.eye(3) - h * M @ prec
    exact = np.mean(
        [
            (np.eye(3) - np.linalg.matrix_power(A, t)) @ np.ones(3)
            for t in range(1, T + 1)
        ],
        axis=0,
    )[0]
    assert got == pytest.approx(exact, rel=1e-9)


@pytest.mark.parametrize(
    "M, match",
    [
        (-1.0, "inverse_mass_matrix must be positive"),
        (np.array([1.0, 0.0, 2.0]), "inverse_mass_matrix must be positive"),
        (
            np.array([[1.0, 2.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 1.0]]),
            "inverse_mass_matrix must be positive definite",
        ),
        (
            np.array([[1.0, 0.5, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]),
            "inverse_mass_matrix must be symmetric",
        ),
        (np.array([1.0, np.nan, 1.0]), "inverse_mass_matrix must be finite"),
        (np.ones((2, 3)), "inverse_mass_matrix must be a scalar"),
        (lambda x: 1.0, "inverse_mass_matrix must be a constant matrix"),
        ("diag", "inverse_mass_matrix must be a scalar"),
    ],
)
def test_bad_inverse_mass_matrix_is_refused_before_tracing(M, match):
    logp = gaussian(np.eye(3))
    with pytest.raises(ValueError, match=match):
        cj.lmc(logp, 0.1, inverse_mass_matrix=M)
    state = cj.ensemble.lmc_init(jnp.zeros((4, 3)), logp)
    with pytest.raises(ValueError, match=match):
        cj.ensemble.lmc_step(jax.random.key(0), state, logp, 0.1, inverse_mass_matrix=M)


def test_a_mass_of_the_wrong_dimension_is_refused_at_init():
    algo = cj.lmc(gaussian(np.eye(3)), 0.1, inverse_mass_matrix=np.ones(2))
    with pytest.raises(
        ValueError, match=r"inverse_mass_matrix must be a scalar .*\(3,\) diagonal"
    ):
        algo.init(jnp.zeros((4, 3)))
