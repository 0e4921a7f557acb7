"""``cj.langevin_warmup``: LMC and CEnLMC tuned on badly scaled posteriors.

The posteriordb check is the conformance criterion of issue 18: every reported
quantity's mean within ``0.1·ref_sd + 3·MCSE`` of the reference (10 chains x 1,000 NUTS
draws of posteriordb, shipped in cenlmc_jax/models/posteriordb/data) and its sd within
10%. The ``0.1·ref_sd`` is the room for LMC's O(h) discretisation bias (the warm-up's
``bias=0.05`` inflates the stiffest whitened variance by 5%, its sd by 2.5%) and for the
reference's own MCSE (ref_sd/sqrt(ESS ~ 4,000) ≈ 0.016 ref_sd); 3·MCSE is this run's
Monte Carlo error (split-chain MCSE over the particles as chains). The unwarmed LMC from
the same start, at the curvature rule, is far off (issue 18: R-hat 43, sd 90% off on
kidiq); here it is checked that its step size is the collapsed one the warm-up replaces.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cenlmc_jax as cj
from cenlmc_jax.diagnostics import mcse
from cenlmc_jax.models import posteriordb as pdb


@pytest.fixture(autouse=True, scope="module")
def _float64():
    """posteriordb's raw-scale models are run in float64 (kidiq's β2 sd is 1e-4 of
    β1's)."""
    with jax.enable_x64(True):
        yield


def constrained_draws(post, result):
    """(chains, draws, k) of the reference's quantities from a (draws, N, d) trace."""
    draws = jax.vmap(jax.vmap(post.constrain_array))(result.trace)
    return np.swapaxes(np.asarray(draws, np.float64), 0, 1)


def check_against_reference(post, draws):
    flat = draws.reshape(-1, draws.shape[-1])
    mean, sd = flat.mean(axis=0), flat.std(axis=0, ddof=1)
    se = np.asarray(mcse(draws, chain_axis=0, sample_axis=1, split=True))
    mean_ok = np.abs(mean - post.ref_mean) <= 0.1 * post.ref_sd + 3 * se
    sd_ok = np.abs(sd / post.ref_sd - 1) <= 0.1
    assert mean_ok.all() and sd_ok.all(), dict(
        names=post.names,
        mean_err=(mean - post.ref_mean) / post.ref_sd,
        mcse=se / post.ref_sd,
        sd_ratio=sd / post.ref_sd,
    )
    return (mean - post.ref_mean) / post.ref_sd, sd / post.ref_sd


def test_lmc_after_the_warm_up_matches_the_kidiq_reference_on_the_raw_scale():
    """kidiq (``kid_score ~ N(β1 + β2 mom_iq, σ)``, mom_iq ~ 100 unscaled: condition
    number ~1e5 of the posterior covariance), started as Stan does (Uniform(-2, 2) on
    the unconstrained scale). The warm-up reports a condition number of M above 1e4 and
    a whitened curvature near 1 (a Gaussian-like posterior: the Laplace start is almost
    exact), and LMC with its M and h matches the reference."""
    post = pdb.load("kidiq-kidscore_momiq")
    n = 64
    x0 = jax.random.uniform(jax.random.key(0), (n, post.d), jnp.float64, -2.0, 2.0)
    wu = cj.langevin_warmup(
        jax.random.key(1), post.logdensity_fn, x0, num_steps=300, sampler="lmc"
    )
    info = wu.info
    assert info.start == "laplace" and info.condition_number > 1e4, info.reasoning
    assert 0.5 < info.curvature < 3.0, info.reasoning  # measured 1.3-1.6
    assert info.grad_evals == n * (300 + 2) and info.hvp_evals > 0
    assert (
        wu.parameters["inverse_mass_matrix"].shape == (3, 3)
        and wu.parameters["step_size"] == info.step_size
    )
    # the curvature rule without the warm-up: h below 1e-4 at the mode already
    # (1/λ_max(H) ~ 1e-4), and the warm-up's h is ~1e4 times larger
    h_plain = cj.adaptation.langevin_step_size(
        float(
            np.linalg.eigvalsh(
                np.linalg.inv(wu.parameters["inverse_mass_matrix"])
            ).max()
        ),
        bias=0.05,
    )
    assert info.step_size > 1e3 * h_plain, (info.step_size, h_plain)

    # check_convergence=False: 64 particles x 300 kept draws give a per-chain R-hat of
    # 1.04 (the criterion asks each chain for ~50 effective draws per half); the MCSE
    # below pools them, which is what is tested
    res = cj.sample(
        jax.random.key(2), wu.algorithm, wu.state, 600, thin=2, check_convergence=False
    )
    assert res.diverged_at == -1
    check_against_reference(post, constrained_draws(post, res))


def test_cenlmc_warm_up_from_the_given_positions_finds_the_scale_and_the_exact_stationary_law():  # noqa: E501
    """CEnLMC on the 2-D Gaussian of tests/ensemble/test_whitened.py (condition number
    1e4, mean (3, -1)) with ``start="positions"`` (Uniform(-2, 2): no Laplace step), so
    the windows alone must find the scale: the curvature at the start is 1e2 (h ≈ 1e-3),
    the estimated M ends within 25% of Σ in every direction (measured 0.99-1.08), the
    whitened curvature near 1, and the handed-over whitened CEnLMC uses the ensemble.
    Its stationary law is then exact: in the handed-over y = L̂⁻¹(x − m̂) the target is
    N(μ_y, Σ_y), CEnLMC is LMC with force ∇f_y + e, E[e | past] = 0, and its covariance
    is the Lyapunov solution Σ = A Σ Aᵀ + 2h I + h² C_e, A = I − h Σ_y⁻¹ (C_e measured),
    as in test_preconditioning.py."""
    from test_whitened import COV, MU, R, logdensity, lyapunov, per_particle

    n = 1000
    x0 = jax.random.uniform(jax.random.key(0), (n, 2), jnp.float32, -2.0, 2.0)
    wu = cj.langevin_warmup(
        jax.random.key(1),
        logdensity,
        x0,
        sampler="cenlmc",
        start="positions",
        num_steps=500,
        f_star=0.0,
    )
    assert wu.info.start == "positions" and wu.info.windows[0][
        "curvature"
    ] == pytest.approx(1e2, rel=1e-3)
    m_hat, mean_hat, h = (
        wu.parameters[k] for k in ("inverse_mass_matrix", "mean", "step_size")
    )
    ratio = np.linalg.eigvalsh(np.linalg.solve(COV, m_hat))
    assert np.all((ratio > 0.8) & (ratio < 1.25)), ratio
    assert 0.7 < wu.info.curvature < 1.5, wu.info.reasoning
    assert wu.info.cenlmc["expected_ensemble_fraction"] > 0.4, wu.info.reasoning

    burn_in, steps = 30, 300
    res = cj.sample(
        jax.random.key(2),
        wu.algorithm,
        wu.state,
        burn_in + steps + 1,
        check_convergence=False,
        trace_fn=lambda s: jnp.concatenate([s.position, s.inner.w], axis=1),
    )
    assert res.diverged_at == -1
    frac = float(np.mean(res.info.ensemble_fraction[burn_in:]))
    assert frac > 0.4, frac  # measured 0.61
    tr = np.asarray(res.trace, np.float64)[burn_in:]
    L = cj.langevin.mass_root(m_hat)
    inv = np.linalg.inv(L)
    y, w_next = (tr[:-1, :, :2] - mean_hat) @ inv.T, tr[1:, :, 2:]
    cov_y, mu_y = inv @ COV @ inv.T, inv @ (MU - mean_hat)
    prec_y = np.linalg.inv(cov_y)
    e = (y - w_next) / h - (y - mu_y) @ prec_y  # F - ∇f_y(y)
    e_mean, e_se = per_particle(e)
    assert np.all(np.abs(e_mean / e_se) < 4.0), (e_mean, e_se)
    A = np.eye(2) - h * prec_y
    c_e, _ = per_particle(e[..., :, None] * e[..., None, :])
    expected = lyapunov(A, 2 * h * np.eye(2) + h**2 * c_e)
    dy = y - mu_y
    yy, yy_se = per_particle(dy[..., :, None] * dy[..., None, :])
    # C_e's own error enters the expected value at h²/(1 - ρ(A)²) ≈ 5h of its size: 2-5%
    # of yy's se here
    z = (yy - expected) / yy_se
    assert np.all(np.abs(z) < 4.0), (yy, expected, z)
    m, m_se = per_particle(y)
    assert np.all(np.abs((m - mu_y) / m_se) < 4.0), (m, mu_y, m_se)
    # and in x: both principal variances within 10% (the ULA bias is +5% at bias=0.05)
    x = tr[:, :, :2].reshape(-1, 2)
    np.testing.assert_allclose(np.diag(R.T @ np.cov(x.T) @ R), [1e2, 1e-2], rtol=0.1)


def test_diagonal_mass_from_the_windows_gives_the_exact_ula_variances():
    """``dense=False`` on N(0, diag(1e2, 1e-2)) from Uniform(-2, 2)
    (``start="positions"``): the diagonal M ends within 25% of the variances, and LMC
    with it has, per coordinate, the exact stationary variance of the linear recursion
    x' = (1 - h M_i/σ_i²) x + sqrt(2h M_i) ξ: 2h M_i / (1 - (1 - h M_i/σ_i²)²)."""
    var = np.array([1e2, 1e-2])
    logp = lambda x: -0.5 * jnp.sum(x**2 / jnp.asarray(var, x.dtype))  # noqa: E731
    n = 500
    x0 = jax.random.uniform(jax.random.key(0), (n, 2), jnp.float64, -2.0, 2.0)
    wu = cj.langevin_warmup(
        jax.random.key(1),
        logp,
        x0,
        start="positions",
        dense=False,
        num_steps=500,
        sampler="lmc",
    )
    m, h = wu.parameters["inverse_mass_matrix"], wu.parameters["step_size"]
    assert m.shape == (2,) and np.all(np.abs(m / var - 1) < 0.25), m
    assert wu.info.grad_evals == n * (500 + 1) and wu.info.lbfgs_steps == 0
    res = cj.sample(
        jax.random.key(2),
        wu.algorithm,
        wu.state,
        400,
        burn_in=50,
        thin=2,
        check_convergence=False,
    )
    per = (np.asarray(res.trace, np.float64) ** 2).mean(
        axis=0
    )  # (N, 2) per-particle averages (mean 0 exact)
    a = 1 - h * m / var
    exact = 2 * h * m / (1 - a**2)
    z = (per.mean(axis=0) - exact) / (per.std(axis=0, ddof=1) / math.sqrt(n))
    assert np.all(np.abs(z) < 4.0), (per.mean(axis=0), exact, z)


def test_a_window_that_diverges_is_rerun_with_half_the_step_or_reported():
    """f = Σ x⁴/4 from |x| ~ 0.01: the curvature at the start (3x² ~ 3e-4) gives h ~
    300, and the first window overflows; it is rerun with h halved until it does not
    (the window's ``retries``), and with ``max_retries=1`` the warm-up stops with a
    RuntimeError that says where."""
    logp = lambda x: -0.25 * jnp.sum(x**4)  # noqa: E731
    x0 = 0.01 * jax.random.uniform(jax.random.key(0), (32, 2), jnp.float64, -1.0, 1.0)
    wu = cj.langevin_warmup(
        jax.random.key(1),
        logp,
        x0,
        start="positions",
        num_steps=100,
        max_retries=20,
        sampler="lmc",
    )
    first = wu.info.windows[0]
    assert first["retries"] > 0 and np.all(np.isfinite(np.asarray(wu.positions))), first
    with pytest.raises(
        RuntimeError, match=r"window 0 \(steps 0\.\.\d+\) diverged 2 times"
    ):
        cj.langevin_warmup(
            jax.random.key(1),
            logp,
            x0,
            start="positions",
            num_steps=100,
            max_retries=1,
            sampler="lmc",
        )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(sampler="nuts"), "sampler must be one of"),
        (dict(start="mode"), "start must be one of"),
        (dict(num_steps=10), "num_steps must be an integer >= 20"),
        (dict(bias=0.0), "bias must be a finite number > 0"),
        (dict(dense="yes"), "dense must be True or False"),
        (dict(f_star=0.0), "sampler='lmc' takes no CEnLMC options"),
    ],
)
def test_bad_arguments_are_refused_naming_them(kwargs, match):
    logp = lambda x: -0.5 * jnp.sum(x**2)  # noqa: E731
    with pytest.raises(ValueError, match=match):
        cj.langevin_warmup(
            jax.random.key(0), logp, jnp.zeros((4, 2)), **{"sampler": "lmc", **kwargs}
        )


def test_relaxation_time_is_that_of_ula_on_a_gaussian():
    """N(0, diag(1e2, 1e-2)) from its Laplace start (exact for a Gaussian: the ensemble
    starts at the target, within ULA's O(h) bias). In the handed-over whitened
    coordinates ULA is the AR(1) ``y' = (I − h P) y + sqrt(2h) ξ``, ``P = Lᵀ Σ⁻¹ L``
    (``M = L Lᵀ`` the warm-up's), whose lag-k correlation along an eigenvector of ``P``
    with eigenvalue ``λ`` is ``(1 − hλ)^k``: ``info.relaxation_steps`` must be ``−1 /
    log(1 − h_b λ_min) · h_b / h`` (``h_b`` the final buffer's step, ``h`` the one
    handed over). Tolerance 25%: with N = 1,000 the correlation near ``e⁻¹`` has sd ``(1
    − ρ²)/sqrt(N) = 0.027``, 7% of τ, and the estimate is the largest of two coordinates
    (biased up by about half that sd) whose law is stationary only up to ULA's 2.5% sd
    bias."""
    var = np.array([1e2, 1e-2])
    logp = lambda x: -0.5 * jnp.sum(x**2 / jnp.asarray(var, x.dtype))  # noqa: E731
    x0 = jax.random.uniform(jax.random.key(0), (1000, 2), jnp.float64, -2.0, 2.0)
    wu = cj.langevin_warmup(
        jax.random.key(1), logp, x0, num_steps=200, curvature_points=8, sampler="lmc"
    )
    info = wu.info
    assert info.start == "laplace", info.reasoning
    L = cj.langevin.mass_root(wu.parameters["inverse_mass_matrix"])
    lam_min = float(np.linalg.eigvalsh(L.T @ np.diag(1 / var) @ L).min())
    h_b, h = info.windows[-1]["step_size"], info.step_size
    expected = -1.0 / math.log(1.0 - h_b * lam_min) * h_b / h
    assert abs(info.relaxation_steps / expected - 1) < 0.25, (
        info.relaxation_steps,
        expected,
        info.reasoning,
    )
    # a Gaussian's curvature is the same everywhere: the mean and the maximum agree, and
    # set h by the bias rule
    assert info.curvature_max == pytest.approx(info.curvature, rel=1e-6)
    assert h == pytest.approx(
        cj.adaptation.langevin_step_size(info.curvature, bias=0.05), rel=1e-6
    )


def test_step_size_follows_the_mean_curvature_and_stays_below_the_stability_limit():
    """On a non-Gaussian target whose curvature varies (f = Σ x²/2 + x⁴/4: ``1 + 3x²``
    along each axis) the handed-over ``h`` is the bias rule at the mean whitened
    curvature over the curvature points, or ``1 / c_max`` when that is smaller: ``h
    c_max <= 1``, half of ULA's stability limit at the stiffest point measured.
    (garch11's raw scale has the same spread: mean 2.9, maximum 10.7 over 256 warm-up
    particles.)"""
    logp = lambda x: -jnp.sum(0.5 * x**2 + 0.25 * x**4)  # noqa: E731
    x0 = jax.random.uniform(jax.random.key(0), (256, 2), jnp.float64, -2.0, 2.0)
    wu = cj.langevin_warmup(
        jax.random.key(1), logp, x0, num_steps=60, curvature_points=32, sampler="lmc"
    )
    i = wu.info
    assert i.curvature_max > 1.5 * i.curvature, (
        i.reasoning
    )  # the tails: whitened curvature 3-4x the mean
    rule = min(
        cj.adaptation.langevin_step_size(i.curvature, bias=0.05), 1.0 / i.curvature_max
    )
    assert (
        i.step_size == pytest.approx(rule, rel=1e-9)
        and i.step_size * i.curvature_max <= 1.0 + 1e-9
    ), i.reasoning


def test_a_piecewise_linear_log_density_is_refused_with_the_reason():
    # issue 28: "curvature must be > 0; got 0.0" named nothing the user wrote; the
    # Laplace density's Hessian vanishes almost everywhere, so the rule has no scale
    x = jax.random.normal(jax.random.key(0), (64, 2))
    with pytest.raises(ValueError, match="piecewise-linear or flat log density"):
        cj.langevin_warmup(
            jax.random.key(1), lambda y: -jnp.sum(jnp.abs(y)), x, sampler="lmc"
        )


def test_starts_outside_the_support_are_redrawn_as_stan_does():
    # issue 46: 12 of 1,024 Lotka-Volterra starts with a NaN log density refused the
    # whole warm-up; Stan redraws such a start (up to 100 times). Exponential on x > 0
    # from N(0, I) starts: the bad ones are redrawn inside the box the good ones span,
    # and the warning counts them
    from cenlmc_jax.adaptation.start import valid_starts

    def logdensity(x):
        return jnp.where(jnp.all(x > 0), -jnp.sum(x), -jnp.inf)

    x = jax.random.normal(jax.random.key(0), (64, 2))
    bad = int(np.sum(~np.all(np.asarray(x) > 0, axis=1)))
    with pytest.warns(UserWarning, match=rf"positions: {bad} of 64 starts had a log"):
        y = np.asarray(valid_starts(jax.random.key(1), logdensity, x))
    assert np.all(y > 0)  # every start is now inside the support
    good = np.all(np.asarray(x) > 0, axis=1)
    np.testing.assert_array_equal(y[good], np.asarray(x)[good])  # the good ones kept


def test_no_valid_start_is_refused_naming_the_first_bad_one():
    def logdensity(x):  # NaN everywhere: a model that always fails
        return jnp.sum(x) * jnp.nan

    x = jax.random.normal(jax.random.key(0), (16, 2))
    with pytest.raises(ValueError, match=r"no start with a finite log.*particle 0"):
        cj.langevin_warmup(jax.random.key(1), logdensity, x)


def _gauss2(x):
    return -0.5 * jnp.sum(x**2 / jnp.array([1.0, 4.0]))


@pytest.mark.parametrize(
    "sampler, phases",
    [
        ("hmc", ("searching for the mode", "start:", "kinetic round 1",
                 "adjusted phase: HMC", "hand-over")),
        ("mala", ("start:", "kinetic round 1", "adjusted phase: MALA", "hand-over")),
        ("lmc", ("start:", "windows of preconditioned LMC", "windows done")),
    ],
)  # fmt: skip
def test_every_phase_of_the_warm_up_reports_its_progress(sampler, phases, capsys):
    """Issue 48: a long warm-up shows its phases as they end. A callable gets each
    line in order; ``progress=True`` prints the same lines to stderr; a bad value is
    refused before any work."""
    x0 = jax.random.uniform(jax.random.key(0), (64, 2), jnp.float64, -2.0, 2.0)
    lines = []
    cj.langevin_warmup(
        jax.random.key(1), _gauss2, x0, sampler=sampler, progress=lines.append
    )
    at = [next(i for i, ln in enumerate(lines) if p in ln) for p in phases]
    assert at == sorted(at), lines  # every phase, in order
    cj.langevin_warmup(jax.random.key(1), _gauss2, x0, sampler=sampler, progress=True)
    err = capsys.readouterr().err
    assert [ln for ln in err.splitlines() if ln.startswith("langevin_warmup: ")] == [
        f"langevin_warmup: {ln}" for ln in lines
    ]
    with pytest.raises(ValueError, match="progress must be"):
        cj.langevin_warmup(jax.random.key(1), _gauss2, x0, progress="yes")
