"""Tests that close the gaps a mutation review found (maintainers' issue, item 1).

Each test here fails under a specific, realistic bug that the rest of the suite
missed; ``benchmarks/mutation_check.py`` applies those bugs to a copy of the
package and checks that these tests (by node id) catch them. The oracles are
written here from the formulas of the spec (docs: ``ALGORITHMS.md`` sections
2-8), not taken from the library:

* EnLMC / CEnLMC: one step from a state with finite ``w`` and ``log p`` against a
  float64 NumPy oracle of the pair sums ``F_ij`` (docs/algorithms.md §2-4), and the
  first two steps of EnLMC against the exact LMC mean recursion (z-test).
* Γ of scalar, diagonal and dense callables ``D``/``Q`` against ``jax.jacfwd``
  of the dense matrix field, one recipe step written out by hand, and the
  stationary second moment of :func:`cenlmc_jax.complete_recipe` with a
  position-dependent ``D(z)`` against the exact stationary law of its Euler
  chain (computed by quadrature).
* The irreversible SDE sampler: its transition kernel on a 2-D grid, built
  from the sampler's own step, leaves ``π × Unif{±1}`` invariant to rounding.

Seeds are fixed and were not chosen: every statistical check is a z-test with
threshold ``Z_MAX`` (false alarm 6e-5 per check for a correct sampler).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cenlmc_jax as cj
from cenlmc_jax import _linalg
from cenlmc_jax.ensemble import cenlmc_step, enlmc_init, enlmc_step
from cenlmc_jax.ensemble.audit import fresh_audit
from cenlmc_jax.ensemble.cenlmc import CEnLMCState, no_lookahead

# |z| below this is accepted: for a correct sampler z ~ N(0, 1), so a false
# alarm has probability 6e-5 per check.
Z_MAX = 4.0
# float64, same formula, different order of summation (the weights exp(log α - log p_j)
# reach ~1e3, sums of ~20 terms): rounding is ~1e-13 relative; 1e-10 leaves room
# and is still 1e7 times below any of the mutations' effects (>= 1e-3 relative).
ROUNDING64 = dict(rtol=1e-10, atol=1e-12)


def x64():
    return jax.enable_x64(True)


# -------------------------------------------------------------------------- EnLMC /
# CEnLMC: the force enters as w' = x - h F (docs/algorithms.md §3-4), F from the pair
# sums.
# --------------------------------------------------------------------------

SIGMA = np.array([1.0, 0.7])  # f(x) = ½ Σ x_k² / σ_k², f* = 0


def _logdensity(x):
    return -0.5 * jnp.sum(x**2 / jnp.asarray(SIGMA**2, x.dtype))


def _grad_f(x):
    return np.asarray(x, np.float64) / SIGMA**2


def _np_pair_sums(x, f, log_p, eta, w=None, r2=None):
    """Σ_{j≠i} F_ij of docs/algorithms.md §2-4 (and N_i of 3.20), float64, straight from
    the formulas:

    F_ij = α_d (f_j - f_i)/|x_j - x_i|² · 1[|x_j - x_i| ≤ η (, |w_j - w_i| ≤ R2)] / p_j
    · (x_j - x_i), α_d = d / V_η, V_η = π^{d/2} η^d / Γ(d/2 + 1), p_j = exp(log_p_j).
    """
    x, f, log_p = (np.asarray(a, np.float64) for a in (x, f, log_p))
    n, d = x.shape
    v_eta = math.pi ** (d / 2) * eta**d / math.gamma(d / 2 + 1)
    alpha = d / v_eta
    u = x[None, :, :] - x[:, None, :]  # u[i, j] = x_j - x_i
    dist = np.sqrt(np.sum(u**2, axis=-1))
    other = ~np.eye(n, dtype=bool)
    mask = other & (dist <= eta)
    n_r2 = np.full(n, n - 1)
    if w is not None:
        w = np.asarray(w, np.float64)
        near_w = other & (np.sqrt(np.sum((w[None] - w[:, None]) ** 2, axis=-1)) <= r2)
        mask &= near_w
        n_r2 = near_w.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        coef = alpha * (f[None, :] - f[:, None]) / dist**2 / np.exp(log_p)[None, :]
    coef = np.where(mask, coef, 0.0)
    return np.einsum("ij,ijk->ik", coef, u), n_r2, mask.sum(axis=1)


def test_enlmc_one_step_uses_the_force_as_w_minus_h_force_over_n_minus_1():
    """From a state after one step (w, log p finite): w' = x - h Σ_j F_ij / (N - 1) for
    every particle (no particle takes a gradient after step 0), x' = w' + sqrt(2h) ξ,
    log p' exact."""
    n, h, eta = 24, 0.05, 0.5
    with x64():
        x0 = jnp.asarray([1.0, -0.5]) + 0.15 * jax.random.normal(
            jax.random.key(0), (n, 2), jnp.float64
        )
        step = jax.jit(lambda k, s: enlmc_step(k, s, _logdensity, h, eta))
        state, _ = step(
            jax.random.key(1), enlmc_init(x0, _logdensity)
        )  # step 0: true gradients
        assert np.all(np.isfinite(state.w)) and np.all(np.isfinite(state.log_p))
        key = jax.random.key(2)
        new, info = step(key, state)
        assert int(info.grad_evals) == 0  # every particle used the ensemble force
        x = np.asarray(state.position)
        force_sum, _, n_ball = _np_pair_sums(
            x, -np.asarray(state.logdensity), state.log_p, eta
        )
        force = force_sum / (n - 1)
        # most particles have neighbours (a real estimate; the others get F = 0, checked
        # too), and the step moves them against the force by h|F| ~ 1e-2 - 1, far above
        # rounding
        assert np.mean(n_ball > 0) > 0.8
        assert np.median(np.linalg.norm(h * force[n_ball > 0], axis=1)) > 1e-2
        np.testing.assert_allclose(new.w, x - h * force, **ROUNDING64)
        xi = np.asarray(
            jax.random.normal(key, (n, 2), jnp.float64)
        )  # the documented draw
        np.testing.assert_allclose(
            new.position, x - h * force + math.sqrt(2 * h) * xi, **ROUNDING64
        )
        np.testing.assert_allclose(
            new.log_p,
            -np.log(4 * np.pi * h) - 0.5 * np.sum(xi**2, axis=1),
            **ROUNDING64,
        )


# A hand-made CEnLMC state whose w fall in four tight clusters (R2-neighbours = cluster
# mates): N_i = 3 = N* (passes exactly at the threshold), N_i = 2 = N* - 1 (fails by
# one), N_i = 4 with one R1 failure and one guard failure, and a cluster beyond f* +
# M_f.
_CLUSTERS = (  # (centre of w, size)
    ((0.0, 0.0), 4),  # A: N_i = 3 = N*     -> ensemble force
    ((1.2, 0.0), 3),  # B: N_i = 2 < N*     -> gradient
    (
        (0.0, -0.6),
        5,
    ),  # C: N_i = 4          -> ensemble force, except particles 0 (R1) and 1 (guard)
    ((2.5, 0.0), 4),  # D: f ≈ 3.1 > M_f    -> gradient
)
C_H, C_ETA, C_R1, C_R2, C_NSTAR, C_MF = 0.05, 0.5, 0.5, 0.2, 3, 2.0


def _cenlmc_hand_state():
    rng = np.random.default_rng(0)
    w, labels = [], []
    for k, (centre, size) in enumerate(_CLUSTERS):
        w.append(
            np.asarray(centre) + 0.04 * rng.uniform(-1, 1, (size, 2))
        )  # cluster diameter < 0.12 < R2
        labels += [k] * size
    w = np.concatenate(w)
    labels = np.asarray(labels)
    delta = 0.12 * rng.standard_normal(w.shape)
    c0 = np.flatnonzero(labels == 2)[0]
    delta[c0] = [C_R1 + 0.05, 0.0]  # |x - w| > R1
    x = w + delta
    log_p = -np.log(4 * np.pi * C_H) - np.sum(delta**2, axis=1) / (
        4 * C_H
    )  # p_j = N(w_j, 2h I) at x_j
    ball_count = np.full(len(x), 5, np.int32)
    ball_count[c0 + 1] = 0  # the guard: an empty η-ball at the previous step
    return x, w, log_p, ball_count, labels


def _cenlmc_oracle(x, w, f, log_p, ball_count, f_star, min_ball=1):
    """w' of docs/algorithms.md §4 (3.19-3.21 and the library's documented guard) in
    float64 NumPy."""
    force_sum, n_i, _ = _np_pair_sums(x, f, log_p, C_ETA, w=w, r2=C_R2)
    fail_r1 = ~(np.linalg.norm(x - w, axis=1) <= C_R1)
    fail_mf = ~(f <= f_star + C_MF)
    fail_n = n_i < max(C_NSTAR, 1)
    fail_ball = ball_count < min_ball
    need = fail_r1 | fail_mf | fail_n | fail_ball
    with np.errstate(divide="ignore", invalid="ignore"):
        ens = force_sum / n_i[:, None]
    force = np.where(need[:, None], _grad_f(x), ens)
    flags = dict(
        r1=fail_r1,
        m_f=fail_mf,
        n_star=fail_n,
        ball=fail_ball & ~(fail_r1 | fail_mf | fail_n),
    )
    return x - C_H * force, need, n_i, flags, ens


def test_cenlmc_one_step_force_normaliser_and_tests_against_numpy_oracle():
    """Hand-made state with N_i on both sides of N*: w' = x - h F_i with F_i = ∇f(x_i)
    for the particles failing a test and Σ_j F_ij 1[|w_j-w_i| ≤ R2] / N_i otherwise
    (N_i = R2-neighbours)."""
    x, w, log_p, ball_count, labels = _cenlmc_hand_state()
    with x64():
        xj = jnp.asarray(x)
        logdensity = jax.vmap(_logdensity)(xj)
        state = CEnLMCState(
            xj,
            logdensity,
            jnp.asarray(w),
            jnp.asarray(log_p),
            jnp.asarray(0.0),
            jnp.asarray(False),
            fresh_audit(jnp.float64),
            jnp.asarray(ball_count),
            no_lookahead(xj),
        )
        step = jax.jit(
            lambda k, s: cenlmc_step(
                k, s, _logdensity, C_H, C_ETA, C_R1, C_R2, C_NSTAR, C_MF
            )
        )
        new, info = step(jax.random.key(3), state)
        f = -np.asarray(logdensity)
        w_new, need, n_i, flags, ens = _cenlmc_oracle(x, w, f, log_p, ball_count, 0.0)
        # the state exercises what it is meant to: both sides of N*, every test,
        # ensemble forces ≠ ∇f
        assert sorted(set(n_i[labels == 0])) == [C_NSTAR] and sorted(
            set(n_i[labels == 1])
        ) == [C_NSTAR - 1]
        assert (
            flags["r1"].sum() == 1
            and flags["ball"].sum() == 1
            and flags["m_f"].sum() == 4
        )
        use = ~need
        assert use[labels == 0].all() and use.sum() == 4 + 3
        assert np.min(np.linalg.norm(ens[use] - _grad_f(x)[use], axis=1)) > 0.05
        assert np.min(np.linalg.norm(C_H * ens[use], axis=1)) > 1e-3
        np.testing.assert_allclose(new.w, w_new, **ROUNDING64)
        assert int(info.grad_evals) == need.sum()
        assert int(info.num_fail_n_star) == flags["n_star"].sum() == 3
        assert (
            int(info.num_fail_r1) == flags["r1"].sum()
            and int(info.num_fail_m_f) == flags["m_f"].sum()
        )
        assert int(info.num_fail_ball) == flags["ball"].sum()
        np.testing.assert_allclose(info.mean_num_neighbours, n_i.mean(), rtol=1e-12)


def test_cenlmc_one_step_after_a_real_step_against_numpy_oracle():
    """The same oracle at a state the sampler made itself (one step from a clustered
    start)."""
    n = 40
    with x64():
        x0 = jnp.asarray([0.8, -0.4]) + 0.1 * jax.random.normal(
            jax.random.key(4), (n, 2), jnp.float64
        )
        state = cj.ensemble.cenlmc_init(x0, _logdensity, 0.0)
        step = jax.jit(
            lambda k, s: cenlmc_step(
                k, s, _logdensity, C_H, C_ETA, C_R1, C_R2, C_NSTAR, C_MF
            )
        )
        state, _ = step(
            jax.random.key(5), state
        )  # step 0: w = +inf, everyone takes its gradient
        new, info = step(jax.random.key(6), state)
        x, w = np.asarray(state.position), np.asarray(state.w)
        w_new, need, n_i, _, _ = _cenlmc_oracle(
            x,
            w,
            -np.asarray(state.logdensity),
            state.log_p,
            np.asarray(state.ball_count),
            0.0,
        )
        assert 0 < need.sum() < n  # both kinds of particle
        np.testing.assert_allclose(new.w, w_new, **ROUNDING64)
        assert int(info.grad_evals) == need.sum()


def test_enlmc_first_steps_follow_the_exact_lmc_mean_recursion():
    """EnLMC's force is an exactly unbiased estimate of ∇f for a quadratic f
    (docs/algorithms.md §2: the second-order term is odd and integrates to 0 over the
    ball; x_j ~ p_j given the past, j ≠ i), so from a fixed x^0 the ensemble mean obeys
    LMC's recursion exactly: E[x̄^m] = (I - h Σ⁻¹)^m x̄^0, m = 1 (true gradients) and
    m = 2 (the first ensemble step).

    z-test over R independent replicate ensembles (the replicate means are i.i.d.). Only
    m <= 2: the start is concentrated (spread 0.1 < sqrt(h)), so the first ensemble
    step's weights 1/p_j have finite variance (E exp(|w_i - w_j|²/(2h)) is finite),
    which the z-test needs; from m = 3 on Theorem 3.2's infinite variance sets in. A
    flipped force sign moves x̄^2 by 2h Σ⁻¹ x̄^1 ≈ (0.14, -0.13), > 20 MCSE (≈ 0.006).
    The replicate means are heavy-tailed (sample kurtosis ~50 at m = 2) but of finite
    variance:
    the self-normalised z is, if anything, conservative for such tails."""
    n, reps, h, eta = 64, 200, 0.05, 0.3
    x0 = np.asarray([1.5, -0.75]) + 0.1 * np.asarray(
        jax.random.normal(jax.random.key(7), (n, 2))
    )
    x0 = jnp.asarray(x0, jnp.float32)

    def two_steps(key):
        k1, k2 = jax.random.split(key)
        s1, _ = enlmc_step(k1, enlmc_init(x0, _logdensity), _logdensity, h, eta)
        s2, info = enlmc_step(k2, s1, _logdensity, h, eta)
        return jnp.mean(s1.position, 0), jnp.mean(s2.position, 0), info.grad_evals

    m1, m2, g = jax.jit(jax.vmap(two_steps))(jax.random.split(jax.random.key(8), reps))
    assert int(np.max(g)) == 0  # the second step used the ensemble force only
    contraction = 1.0 - h / SIGMA**2
    xbar0 = np.mean(np.asarray(x0, np.float64), 0)
    for m, means in ((1, m1), (2, m2)):
        means = np.asarray(means, np.float64)
        z = (means.mean(0) - contraction**m * xbar0) / (
            means.std(0, ddof=1) / math.sqrt(reps)
        )
        assert np.all(np.abs(z) < Z_MAX), (m, z)


# -------------------------------------------------------------------------- Γ_i = Σ_j
# ∂_j (D_ij + s Q_ij) (docs/algorithms.md §5, 8) for every matrix form, against
# jax.jacfwd.
# --------------------------------------------------------------------------

# position-dependent fields on R^3 in the three forms of cenlmc_jax._linalg (c·I,
# diag(v), dense)
_FIELDS = {
    "scalar": lambda z: 1.0 + 0.5 * z[0] ** 2 + jnp.sin(z[1]) * z[2],
    "diagonal": lambda z: jnp.stack(
        [1.0 + z[0] * z[1], jnp.exp(0.3 * z[1]), 1.0 + z[2] ** 2 + z[0]]
    ),
    "dense": lambda z: jnp.stack(
        [
            jnp.stack([z[0] ** 2, z[1] * z[2], jnp.sin(z[0])]),
            jnp.stack([z[0] + z[2], jnp.cos(z[2]) * z[1], z[1] ** 2]),
            jnp.stack([z[2] * z[0], jnp.tanh(z[1]), z[1] + z[2] ** 3]),
        ]
    ),
}


def _dense_field(form):
    fn = _FIELDS[form]
    if form == "scalar":
        return lambda z: fn(z) * jnp.eye(z.shape[0], dtype=z.dtype)
    if form == "diagonal":
        return lambda z: jnp.diag(fn(z))
    return fn


def _divergence_by_jacfwd(form, z):
    """Σ_j ∂_{z_j} M_ij(z) of the dense (d, d) field: jac[i, j, k] = ∂_k M_ij, traced
    over (j, k)."""
    return jnp.einsum("ijj->i", jax.jacfwd(_dense_field(form))(z))


@pytest.mark.parametrize("form", list(_FIELDS))
def test_gamma_term_of_every_matrix_form_in_d_and_q_matches_jacfwd_of_the_matrix_field(
    form,
):
    """Each form alone in D and in Q (s = ±1), beside a constant, paired with every
    other form, and through has_aux, at 8 random points: float64 rounding only (the same
    derivatives, summed in another order; 1e-12 relative)."""
    M = _FIELDS[form]

    def cases(z):
        """(library Γ, reference Γ) pairs at one point."""
        ref = _divergence_by_jacfwd(form, z)
        out = [(_linalg.gamma_term(M, None, z), ref)]
        for sign in (1.0, -1.0):
            out.append((_linalg.gamma_term(None, M, z, sign), sign * ref))
            out.append(
                (_linalg.gamma_term(1.5, M, z, sign), sign * ref)
            )  # a constant D adds nothing
            for other in _FIELDS:
                ref_o = _divergence_by_jacfwd(other, z)
                out.append(
                    (_linalg.gamma_term(M, _FIELDS[other], z, sign), ref + sign * ref_o)
                )
                out.append(
                    (_linalg.gamma_term(_FIELDS[other], M, z, sign), ref_o + sign * ref)
                )
        gam, (aux_d, aux_q) = _linalg.gamma_term(
            lambda y: (M(y), jnp.sum(y)), None, z, has_aux=True
        )
        assert aux_q is None
        out.append((gam, ref))
        lib, want = (jnp.stack(a) for a in zip(*out, strict=True))
        return lib, want, ref, aux_d

    with x64():
        zs = jax.random.normal(jax.random.key(9), (8, 3), jnp.float64)
        lib, want, ref, aux_d = jax.jit(jax.vmap(cases))(zs)
        assert (
            np.min(np.max(np.abs(np.asarray(ref)), axis=1)) > 0.1
        )  # a real divergence, not a zero to match
        np.testing.assert_allclose(lib, want, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(aux_d, np.sum(np.asarray(zs), axis=1), rtol=1e-12)


def test_recipe_step_with_a_scalar_d_of_z_is_the_hand_written_euler_step():
    """D(z) = c(z)·I (scalar form), Q = q J: z' = z + ε[(c I + Q)∇log π + ∇c] +
    sqrt(2εc) ξ, Γ written by hand (∇c; a constant Q has none), keys split as
    documented."""
    with x64():
        c = lambda z: 1.0 + 0.5 * jnp.sum(z**2)  # noqa: E731  ∇c = z
        Qm = 0.7 * np.array([[0.0, -1.0], [1.0, 0.0]])
        grad = lambda th: -th / jnp.asarray(SIGMA**2)  # noqa: E731  ∇log π of N(0, diag σ²)
        est = cj.gradients.grad_estimator_from_grad(grad)
        eps = 0.03
        alg = cj.complete_recipe(est, eps, c, Qm)
        for seed, z in enumerate(([0.4, -1.1], [1.5, 0.8], [-2.0, 0.3])):
            z = jnp.asarray(z, jnp.float64)
            key = jax.random.key(20 + seed)
            new, _ = alg.step(key, alg.init(z))
            _, key_noise = jax.random.split(key)
            xi = jax.random.normal(key_noise, (2,), jnp.float64)
            hand = (
                z
                + eps * (c(z) * grad(z) + Qm @ grad(z) + z)
                + jnp.sqrt(2 * eps * c(z)) * xi
            )
            # eigh of 2εc·I gives the root sqrt(2εc) to rounding; Γ = z moves z' by ε|z|
            # >= 0.01
            np.testing.assert_allclose(new.position, hand, rtol=1e-12, atol=1e-12)


# The stationary test's chain: target N(0, 1) on R, D(z) = c(z) = 1 + z²/2 (scalar
# form), Q = 0, so Γ = c'(z) = z. Its Euler chain z' = z + ε(-c z + c') + sqrt(2εc) ξ
# has a stationary law π_ε = π + O(ε); without Γ the SDE's stationary law is ∝ π/c
# instead (E z² ≈ 0.6, not ≈ 1).
REC_EPS = 0.02
_rec_c = lambda z: 1.0 + 0.5 * z**2  # noqa: E731


def _euler_stationary_second_moment(with_gamma: bool) -> float:
    """E z² under the exact stationary law of the Euler chain, by Nyström quadrature:
    the Gaussian kernel K(z, y) = N(y; z + ε(-c z + [c']), 2εc(z)) on a grid of spacing
    0.01 over [-9, 9] (kernel sd >= sqrt(2ε) = 0.2 = 20 grid steps: the trapezoid rule
    is exact to ~1e-30 for it; the mass beyond ±9 is ~1e-18), rows normalised, π_ε K =
    π_ε solved."""
    z = np.linspace(-9.0, 9.0, 1801)
    c = 1.0 + 0.5 * z**2
    mean = z + REC_EPS * (-c * z + (z if with_gamma else 0.0))
    var = 2.0 * REC_EPS * c
    K = np.exp(-0.5 * (z[None, :] - mean[:, None]) ** 2 / var[:, None]) / np.sqrt(
        2 * np.pi * var[:, None]
    )
    K /= K.sum(axis=1, keepdims=True)
    A = K.T - np.eye(len(z))
    A[-1] = 1.0
    b = np.zeros(len(z))
    b[-1] = 1.0
    p = np.linalg.solve(A, b)
    return float(np.sum(p * z**2))


def test_complete_recipe_with_position_dependent_d_has_the_stationary_second_moment():
    """cj.complete_recipe on N(0, 1) with D(z) = 1 + z²/2: E z² of 500 chains x 1000
    steps (after 200 from z ~ N(0, 1)) against the exact stationary law of the Euler
    chain (quadrature, so no discretisation bias enters the tolerance). MCSE from the
    500 per-chain averages (independent chains: no autocorrelation estimate). Without Γ
    (or with the scalar-form Γ zeroed) E z² ≈ 0.6: the quadrature puts it > 15 MCSE
    away, asserted below."""
    chains, burn, steps = 500, 200, 1000
    target_m2 = _euler_stationary_second_moment(True)
    wrong_m2 = _euler_stationary_second_moment(False)
    assert abs(target_m2 - 1.0) < 0.05  # π_ε is π up to O(ε)
    est = cj.gradients.grad_estimator_from_grad(lambda z: -z)
    alg = cj.complete_recipe(est, REC_EPS, lambda z: _rec_c(z[0]), 0.0)
    z0 = jax.random.normal(jax.random.key(30), (chains, 1))
    states = jax.vmap(alg.init)(z0)
    step = jax.vmap(alg.step)

    @jax.jit
    def run(states, key):
        def body(carry, k):
            s, acc = carry
            s, _ = step(jax.random.split(k, chains), s)
            return (s, acc + s.position[:, 0] ** 2), None

        def burn_body(s, k):
            return step(jax.random.split(k, chains), s)[0], None

        kb, kr = jax.random.split(key)
        states, _ = jax.lax.scan(burn_body, states, jax.random.split(kb, burn))
        (states, acc), _ = jax.lax.scan(
            body, (states, jnp.zeros(chains)), jax.random.split(kr, steps)
        )
        return acc / steps, states

    per_chain, final = run(states, jax.random.key(31))
    per_chain = np.asarray(per_chain, np.float64)
    assert np.all(np.isfinite(per_chain))
    m2, se = per_chain.mean(), per_chain.std(ddof=1) / math.sqrt(chains)
    assert abs(wrong_m2 - target_m2) > 15 * se, (
        wrong_m2,
        target_m2,
        se,
    )  # the test has the power
    assert abs(m2 - target_m2) / se < Z_MAX, (m2, target_m2, se)


# -------------------------------------------------------------------------- The
# irreversible SDE sampler (docs/algorithms.md §7-8): exact invariance of its kernel on
# a grid.
# --------------------------------------------------------------------------

_JROT = np.array([[0.0, -1.0], [1.0, 0.0]])  # skew-symmetric
SDE_GRID_EPS = 0.1


def _banana_logdensity(z):
    """A non-Gaussian 2-D target (unnormalised; the grid normalises it)."""
    return -0.5 * z[0] ** 2 - (z[1] - 0.4 * z[0] ** 2 + 0.3) ** 2 / (2 * 0.6)


def _sde_D(z):
    return 0.5 + 0.5 / (
        1.0 + z**2
    )  # diagonal, position dependent: Γ_D ≠ 0, L(z) varies


def _sde_Q(z):
    return (1.5 + 0.5 * jnp.tanh(z[0])) * jnp.asarray(_JROT, z.dtype)  # Γ_Q ≠ 0


def _grid_kernel_pieces(proposal):
    """On a 2-D grid, for s = ±1: W[s][k, l] = f̃(y_l | x_k, s)·ΔA (the proposal's own
    density) and A[s][k, l] = the acceptance probability the sampler's own step computes
    for the move x_k -> y_l (cj.irreversible_mh with the proposal's draw pinned to y_l),
    and whether that step moved to (y_l, s) when it accepted and to (x_k, -s) when it
    rejected."""
    axis = np.linspace(-2.5, 2.5, 21)
    grid = np.stack(np.meshgrid(axis, axis + 0.5, indexing="ij"), -1).reshape(-1, 2)
    area = (axis[1] - axis[0]) ** 2

    def pair(x, y, s):
        pinned = proposal._replace(sample=lambda key, z, d, cache=None: y)
        alg = cj.irreversible_mh(_banana_logdensity, pinned)
        state = alg.init(x)._replace(direction=s)
        new, info = alg.step(jax.random.key(0), state)
        log_f = proposal.log_forward(y, x, s, state.cache)
        moved_right = jnp.where(
            info.is_accepted,
            jnp.all(new.position == y) & jnp.all(new.direction == s),
            jnp.all(new.position == x) & jnp.all(new.direction == -s),
        )
        return jnp.exp(log_f) * area, info.acceptance_rate, moved_right

    fn = jax.jit(jax.vmap(jax.vmap(pair, (None, 0, None)), (0, None, None)))
    out = {}
    with x64():
        g = jnp.asarray(grid)
        for s in (1.0, -1.0):
            w, a, ok = fn(g, g, jnp.full((1,), s))
            out[s] = (np.asarray(w), np.asarray(a), np.asarray(ok))
        log_pi = np.asarray(jax.vmap(_banana_logdensity)(g))
    pi = np.exp(log_pi - log_pi.max())
    return pi / pi.sum(), out


def _invariance_error(pi, pieces):
    """max over (y, s) of |(π̃P)(y, s) - π̃(y, s)| / max π̃, π̃ = π × ½ on (x, s).

    P((x, s) -> (y, s)) = c W a (accept: keep s), P((x, s) -> (x, -s)) = 1 - Σ_y c W a
    (reject: flip). The constant c <= 1 makes every row a probability (a lazy chain: the
    proposal mass off the grid, and c's share, count as rejections); it cancels from the
    invariance equations."""
    c = 1.0 / max(
        1.0, max(float((w * a).sum(axis=1).max()) for w, a, _ in pieces.values())
    )
    err = 0.0
    for s in (1.0, -1.0):
        w, a, _ = pieces[s]
        w_back, a_back, _ = pieces[-s]
        reject_back = 1.0 - c * (w_back * a_back).sum(
            axis=1
        )  # at (y, -s): flips into (y, s)
        new = 0.5 * (pi @ (c * w * a)) + 0.5 * pi * reject_back
        err = max(err, float(np.max(np.abs(new - 0.5 * pi))) / float(0.5 * pi.max()))
    return err


def test_irreversible_sde_sampler_kernel_leaves_pi_times_uniform_direction_invariant_on_a_grid():  # noqa: E501
    """cj.irreversible_mh with cj.irreversible.sde_proposal (callable D(z), Q(z) ≠ 0,
    ε = 0.1) on a banana, restricted to proposals on a 21 x 21 grid: the transition
    matrix on (grid point, s), built from the sampler's own step and the proposal's own
    density, satisfies πP = π exactly (skew detailed balance holds pair by pair whenever
    g̃(·|y, s) = f̃(·|y, -s), docs/algorithms.md §7, so the grid restriction is exact,
    not an approximation). Tolerance 1e-11 relative: float64 rounding of sums of 441
    terms is ~1e-14. The negative control, the backward density taken from the forward
    process (no adjoint Q -> -Q), breaks it by > 1e-3."""
    prop = cj.irreversible.sde_proposal(
        _sde_D, _sde_Q, _banana_logdensity, SDE_GRID_EPS
    )
    pi, pieces = _grid_kernel_pieces(prop)
    for s, (w, a, ok) in pieces.items():
        assert ok.all(), s  # accept -> (y, s), reject -> (x, -s), as the kernel assumes
        assert (
            0.05 < float((pi @ (w * a)).sum()) < 0.98
        )  # both accepts and rejections carry mass
    # the proposal mass on the grid is nearly all of it in the bulk: the kernel is not
    # degenerate
    assert float(np.median(pieces[1.0][0].sum(axis=1))) > 0.95
    err = _invariance_error(pi, pieces)
    assert err < 1e-11, err

    no_adjoint = prop._replace(
        log_backward=lambda z, z_star, d, cache=None: prop.log_forward(
            z, z_star, d, cache
        )
    )
    bad = _invariance_error(*_grid_kernel_pieces(no_adjoint))
    assert bad > 1e-3, bad


def test_sde_proposal_draws_from_its_own_forward_density():
    """The kernel above uses log f̃; the chain uses sample. Exactly (no Monte Carlo):
    for a fixed key the draw is z* = m_s(z) + sqrt(2ε) L(z) ξ with ξ = normal(key), so
    log f̃(z*|z, s) must equal log N(ξ; 0, I) - log det(sqrt(2ε) L(z)), L(z) =
    sqrt(D(z))."""
    prop = cj.irreversible.sde_proposal(
        _sde_D, _sde_Q, _banana_logdensity, SDE_GRID_EPS
    )

    def check(z, key, s):
        cache = prop.point_fn(z)[1]
        z_star = prop.sample(key, z, s, cache)
        xi = jax.random.normal(key, z.shape, z.dtype)
        want = jnp.sum(-0.5 * xi**2 - 0.5 * jnp.log(2 * jnp.pi)) - jnp.sum(
            0.5 * jnp.log(2 * SDE_GRID_EPS * _sde_D(z))
        )
        return prop.log_forward(z_star, z, s, cache), want

    with x64():
        zs = jax.random.normal(jax.random.key(40), (64, 2), jnp.float64)
        keys = jax.random.split(jax.random.key(41), 64)
        for s in (1.0, -1.0):
            got, want = jax.jit(jax.vmap(check, (0, 0, None)))(
                zs, keys, jnp.full((1,), s)
            )
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
