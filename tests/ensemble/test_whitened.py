"""``cj.whitened``: the ensemble samplers in whitened coordinates ``y = L⁻¹(x − m)``,
``M = L Lᵀ`` fixed.

The target: a 2-D Gaussian ``N(μ, Σ)`` with condition number 1e4 (variances 1e2 and 1e-2
along a rotated basis) and a mean away from 0. Whitened by its own ``μ, Σ`` it is ``N(0,
I)`` in ``y``, where CEnLMC's ensemble estimate is exactly unbiased given the past (a
quadratic ``f``: cenlmc_jax/ensemble/whitened.py's docstring), so CEnLMC is LMC with
force ``∇f_y + e``, ``E[e | past] = 0``, and (as in tests/ensemble/test_cenlmc.py) its
stationary covariance in ``y`` is the exact ULA covariance ``Σ_LMC = I / (1 − h/2)``
plus the inflation ``Lyap(A, h² C_e)`` by the measured force noise (``A = (1 − h) I``);
in ``x`` it is ``L (Σ_LMC + ΔΣ) Lᵀ``, around ``μ``. All are MCSE z-tests on the N
per-particle time averages (treated as i.i.d.: the particles interact only through the
zero-mean noise of the ensemble force), |z| < 4 (a false alarm 6e-5 per check).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cenlmc_jax as cj

Z_MAX = 4.0
H = 0.05
# docs/algorithms.md's configuration (section 4) with N* = 5, as
# tests/ensemble/test_cenlmc.py: in y the target is N(0, I), the unit-scale target these
# were chosen for
ETA, R1, R2, N_STAR, M_F = 0.3, 0.5, 0.3, 5, 10.0

R = np.array([[math.cos(0.5), -math.sin(0.5)], [math.sin(0.5), math.cos(0.5)]])
COV = R @ np.diag([1e2, 1e-2]) @ R.T
MU = np.array([3.0, -1.0])
PREC = np.linalg.inv(COV)
F_STAR = 0.5 * math.log(
    np.linalg.det(2 * math.pi * COV)
)  # min of -log N(x; μ, Σ) (normalised)


def logdensity(x):
    d = x - jnp.asarray(MU, x.dtype)
    return -0.5 * d @ jnp.asarray(PREC, x.dtype) @ d - F_STAR


def lyapunov(A, Q):
    d = A.shape[0]
    return np.linalg.solve(np.eye(d * d) - np.kron(A, A), Q.reshape(-1)).reshape(d, d)


def per_particle(values):
    per = values.mean(axis=0)
    return per.mean(axis=0), per.std(axis=0, ddof=1) / math.sqrt(per.shape[0])


def exact_draws(n, seed, dtype=jnp.float32):
    z = np.random.default_rng(seed).normal(size=(n, 2))
    return jnp.asarray(MU + z @ np.linalg.cholesky(COV).T, dtype)


def test_whitened_cenlmc_has_the_right_moments_at_condition_number_1e4():
    n, steps, burn_in = 1000, 300, 60
    algo = cj.whitened(
        cj.cenlmc,
        logdensity,
        H,
        ETA,
        R1,
        R2,
        N_STAR,
        M_F,
        f_star=0.0,
        inverse_mass_matrix=COV,
        mean=MU,
    )
    state = algo.init(exact_draws(n, 0))
    # the burn-in is cut from the trace (one compiled program: the machine is slow to
    # compile CEnLMC)
    res = cj.sample(
        jax.random.key(0),
        algo,
        state,
        burn_in + steps + 1,
        check_convergence=False,
        trace_fn=lambda s: jnp.concatenate([s.position, s.inner.w], axis=1),
    )
    assert res.diverged_at == -1
    tr = np.asarray(res.trace, np.float64)[burn_in:]
    x, w_next = tr[:-1, :, :2], tr[1:, :, 2:]
    L = cj.langevin.mass_root(COV)
    y = (x - MU) @ np.linalg.inv(L).T  # the positions mapped back are m + L y
    frac = float(np.mean(res.info.ensemble_fraction[burn_in:-1]))
    # the ensemble is used (measured 0.64 on N(0, I) in tests/ensemble/test_cenlmc.py)
    assert frac >= 0.4, frac

    # the ensemble force, in y: e = F - ∇f_y(y) = F - y; E[e] = 0 and E[e yᵀ] = 0
    # (unbiased given the past; the second catches a force off by a factor)
    e = (y - w_next) / H - y
    e_mean, e_se = per_particle(e)
    assert np.all(np.abs(e_mean / e_se) < Z_MAX), (e_mean, e_se)
    ey, ey_se = per_particle(e[..., :, None] * y[..., None, :])
    assert np.all(np.abs(ey / ey_se) < Z_MAX), (ey, ey_se)

    # covariance: exact ULA covariance in y plus the inflation by the measured force
    # noise, mapped to x
    A = (1 - H) * np.eye(2)
    sigma_lmc = lyapunov(A, 2 * H * np.eye(2))
    np.testing.assert_allclose(sigma_lmc, np.eye(2) / (1 - H / 2))
    c_e, c_e_se = per_particle(e[..., :, None] * e[..., None, :])
    infl, infl_se = (
        lyapunov(A, H**2 * c_e),
        lyapunov(A, H**2 * c_e_se),
    )  # A diagonal: linear, entrywise
    expected_x = L @ (sigma_lmc + infl) @ L.T
    infl_x_se = (
        np.abs(L) @ infl_se @ np.abs(L).T
    )  # a bound on the propagated standard error
    dx = x - MU
    xx, xx_se = per_particle(dx[..., :, None] * dx[..., None, :])
    z = (xx - expected_x) / np.sqrt(xx_se**2 + infl_x_se**2)
    assert np.all(np.abs(z) < Z_MAX), (xx, expected_x, z)
    m, m_se = per_particle(x)
    assert np.all(np.abs((m - MU) / m_se) < Z_MAX), (m, m_se)
    # the variances of both principal directions, 1e2 and 1e-2, within 10% (ΔΣ measured
    # 2-8% on N(0, I))
    var = np.diag(R.T @ xx @ R)
    np.testing.assert_allclose(var, [1e2, 1e-2], rtol=0.1)


def test_unwhitened_cenlmc_at_the_curvature_rule_does_not_move_in_the_wide_direction():
    """The same target unwhitened: the curvature rule gives h = 2·0.05/(1.05·1e2) ≈ 1e-3
    (λ_max = 1e2), so in 300 steps the wide direction (variance 1e2) spreads by ≈
    2h·300 = 0.6 from a tight start."""
    h = cj.adaptation.langevin_step_size(1.0 / 1e-2, bias=0.05)
    p = cj.ensemble.tuning.suggest_cenlmc_params(2, h, num_particles=500)
    algo = cj.cenlmc(logdensity, h, p.eta, p.r1, p.r2, p.n_star, p.m_f, f_star=0.0)
    x0 = jnp.asarray(
        MU + 0.01 * np.random.default_rng(1).normal(size=(500, 2)), jnp.float32
    )
    res = cj.sample(
        jax.random.key(1),
        algo,
        algo.init(x0),
        300,
        mode="stream",
        check_convergence=False,
    )
    spread = float(np.var(np.asarray(res.state.position, np.float64) @ R[:, 0]))
    assert spread < 0.02 * 1e2, (
        spread
    )  # whitened, the same 300 steps relax it: the test above


def test_whitened_lmc_is_preconditioned_lmc():
    """``L = M^{1/2}`` (symmetric): cj.whitened(cj.lmc, ...) is cj.lmc(...,
    inverse_mass_matrix=M), the same draws up to rounding."""
    x0 = exact_draws(16, 2)
    pre = cj.lmc(logdensity, H, inverse_mass_matrix=COV)
    a = cj.sample(jax.random.key(3), pre, pre.init(x0), 6, check_convergence=False)
    wl = cj.whitened(cj.lmc, logdensity, H, inverse_mass_matrix=COV, mean=MU)
    b = cj.sample(jax.random.key(3), wl, wl.init(x0), 6, check_convergence=False)
    np.testing.assert_allclose(
        b.trace, a.trace, rtol=2e-4, atol=2e-4
    )  # float32, entries of size 10


def test_a_grad_fn_of_x_is_mapped_to_y_as_a_keyword_and_in_options():
    """grad_fn (of x) becomes y ↦ Lᵀ grad_fn(m + L y) = ∇_y log π(m + L y), in float64,
    both where the ensemble samplers take it (a keyword, ``options.grad_fn``)."""
    from cenlmc_jax.ensemble.whitened import (
        _whiten_kwargs,
        whiten_logdensity,
        whitening,
    )

    w = whitening(COV, MU)
    with jax.enable_x64(True):
        y = jnp.asarray([[0.3, -1.2], [2.0, 0.5]], jnp.float64)
        auto = jax.vmap(jax.grad(whiten_logdensity(logdensity, w)))(y)
        for kwargs, get in (
            ({"grad_fn": jax.grad(logdensity)}, lambda k: k["grad_fn"]),
            (
                {"options": cj.EnsembleOptions(grad_fn=jax.grad(logdensity))},
                lambda k: k["options"].grad_fn,
            ),
        ):
            mapped = get(_whiten_kwargs(kwargs, w))
            got = jax.vmap(mapped)(y)
            assert got.dtype == jnp.float64
            np.testing.assert_allclose(got, auto, rtol=1e-12)
            np.testing.assert_allclose(w.to_y(w.to_x(y)), y, rtol=1e-12)


def test_bad_arguments_are_refused_naming_them():
    with pytest.raises(
        ValueError, match="inverse_mass_matrix must be positive definite"
    ):
        cj.whitened(
            cj.cenlmc,
            logdensity,
            H,
            ETA,
            R1,
            R2,
            N_STAR,
            M_F,
            inverse_mass_matrix=np.diag([1.0, -1.0]),
        )
    with pytest.raises(ValueError, match="inverse_mass_matrix must be a concrete"):
        cj.whitened(cj.lmc, logdensity, H, inverse_mass_matrix=None)
    with pytest.raises(ValueError, match=r"mean must be a finite \(d,\) array"):
        cj.whitened(
            cj.lmc, logdensity, H, inverse_mass_matrix=1.0, mean=np.zeros((2, 2))
        )
    with pytest.raises(ValueError, match="mean has shape"):
        cj.whitened(cj.lmc, logdensity, H, inverse_mass_matrix=COV, mean=np.zeros(3))
    algo = cj.whitened(cj.lmc, logdensity, H, inverse_mass_matrix=np.ones(3))
    with pytest.raises(
        ValueError, match=r"inverse_mass_matrix must be a scalar .*\(2,\) diagonal"
    ):
        algo.init(jnp.zeros((4, 2)))
    algo = cj.whitened(cj.lmc, logdensity, H, inverse_mass_matrix=2.0, mean=np.zeros(3))
    with pytest.raises(ValueError, match=r"mean must have shape \(2,\)"):
        algo.init(jnp.zeros((4, 2)))
    algo = cj.whitened(cj.lmc, logdensity, H, inverse_mass_matrix=2.0)
    with pytest.raises(ValueError, match="WhitenedState"):
        algo.step(
            jax.random.key(0), cj.ensemble.lmc_init(jnp.zeros((4, 2)), logdensity)
        )
