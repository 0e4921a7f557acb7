"""``jax.grad`` through ``cj.sample`` for every sampler: the pathwise derivative.

The derivative of a run's streamed mean with respect to a parameter ``μ`` of
the target (here a shift: ``log π(x) = -|x - μ|²/2``) is checked against a
central finite difference with common random numbers (the same key, so the
same noise): ``(m(μ + ε) - m(μ - ε)) / 2ε``.

What the derivative means: the noise is reparameterised (fixed by the key),
and every discrete decision (CEnLMC's masks and tests, a Metropolis accept or
reject, a direction flip) is held where the run put it: a pathwise
derivative. The finite difference agrees with it as long as no decision flips
between ``μ - ε`` and ``μ + ε``; the tests check that none did (the same
accept pattern, the same gradient counts), so a disagreement is a real error.
For LMC the value is known exactly (``test_run.py``).

EnLMC and CEnLMC are also run at N = 200 through the tiled and block-sparse
pair kernels (the ones ``method="auto"`` picks above 64 particles), and
``jax.grad`` through ``ensemble_force`` itself is held to the dense kernel's
gradient with non-finite rows, to a rounding bound.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_pairwise import eta_for_neighbours, lmc_like_ensemble

import cenlmc_jax as cj
from cenlmc_jax.pairwise import DIRECT_MAX_D, ensemble_force, ensemble_force_tiled
from cenlmc_jax.pairwise.algebra import (
    column_weights,
    max_shared_spread,
    prepare,
    tile_spec,
)
from cenlmc_jax.pairwise.sparsity import sort_spatially
from cenlmc_jax.pairwise.tiled import SPARSE_BLOCK_COLS, sparse_capacity, sparse_plan

J = np.array([[0.0, 1.0], [-1.0, 0.0]])


def shifted(mu):
    return lambda x: -0.5 * jnp.sum((x - mu) ** 2)


# name -> (build(mu) -> SamplingAlgorithm, ensemble?, steps)
SAMPLERS = {
    "lmc": (lambda mu: cj.lmc(shifted(mu), 0.1), True, 30),
    "enlmc": (lambda mu: cj.enlmc(shifted(mu), 0.05, 0.8, audit_size=0), True, 5),
    "cenlmc": (
        lambda mu: cj.cenlmc(shifted(mu), 0.05, 0.8, 0.5, 0.5, 2, 10.0, f_star=0.0),
        True,
        20,
    ),
    "cenlmc_dense_grad": (
        lambda mu: cj.cenlmc(
            shifted(mu), 0.05, 0.8, 0.5, 0.5, 2, 10.0, f_star=0.0, dense_grad=True
        ),
        True,
        20,
    ),
    "complete_recipe": (
        lambda mu: cj.complete_recipe(
            cj.gradients.grad_estimator_from_logdensity(shifted(mu)), 0.05, np.eye(2), J
        ),
        False,
        30,
    ),
    "sgld": (
        lambda mu: cj.sgld(
            cj.gradients.grad_estimator_from_logdensity(shifted(mu)), 0.05
        ),
        False,
        30,
    ),
    "sgrld": (
        lambda mu: cj.sgrld(
            cj.gradients.grad_estimator_from_logdensity(shifted(mu)),
            0.05,
            lambda t: 1.0 + 0.1 * t**2,
        ),
        False,
        30,
    ),
    "sghmc": (
        lambda mu: cj.sghmc(
            cj.gradients.grad_estimator_from_logdensity(shifted(mu)), 0.05
        ),
        False,
        30,
    ),
    "sgrhmc": (
        lambda mu: cj.sgrhmc(
            cj.gradients.grad_estimator_from_logdensity(shifted(mu)),
            0.05,
            cj.sgmcmc.gsgrhmc_inv_metric(lambda t: 0.5 * jnp.sum(t**2)),
        ),
        False,
        30,
    ),
    "irreversible_mh_sde": (
        lambda mu: cj.irreversible_mh(
            shifted(mu), cj.irreversible.sde_proposal(1.0, J, shifted(mu), 0.1)
        ),
        False,
        20,
    ),
    "irreversible_mh_gamma": (
        lambda mu: cj.irreversible_mh(
            shifted(mu), cj.irreversible.gamma_proposal(2.0, 0.3)
        ),
        False,
        20,
    ),
    "rwmh": (lambda mu: cj.rwmh(shifted(mu), 0.5), False, 20),
    "mala": (lambda mu: cj.mala(shifted(mu), 0.3), False, 20),
    "hmc": (lambda mu: cj.hmc(shifted(mu), 0.3, 4), False, 20),
    "autostep_hmc": (lambda mu: cj.autostep_hmc(shifted(mu), 0.9, 4), False, 20),
}


def run(name, mu):
    """(streamed mean of coordinate 0, per-step infos) of a short float64 run."""
    build, ensemble, steps = SAMPLERS[name]
    algo = build(mu)
    x0 = jax.random.normal(jax.random.key(0), (32, 2), jnp.float64)
    if not ensemble:
        algo = cj.vmap_chains(algo)
    state = algo.init(x0, jax.random.key(1))
    res = cj.sample(
        jax.random.key(2), algo, state, steps, mode="stream", info_reduce=None
    )
    return res.moments.mean[0], res.info


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_pathwise_derivative_matches_common_random_numbers_finite_difference(name):
    with jax.enable_x64(True):
        mu0, eps = 0.3, 1e-5
        grad = float(jax.grad(lambda m: run(name, m)[0])(jnp.float64(mu0)))
        (hi, info_hi), (lo, info_lo) = run(name, mu0 + eps), run(name, mu0 - eps)
        # the discrete decisions must be the same on both sides, or the finite
        # difference is not pathwise
        for field in (
            "is_accepted",
            "direction_flipped",
            "grad_evals",
            "ensemble_fraction",
        ):
            if hasattr(info_hi, field):
                np.testing.assert_array_equal(
                    np.asarray(getattr(info_hi, field)),
                    np.asarray(getattr(info_lo, field)),
                )
        fd = (float(hi) - float(lo)) / (2 * eps)
        assert np.isfinite(grad), grad
        # float64 central difference: truncation O(ε²) and rounding ~1e-16/ε, both far
        # below 1e-6
        np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-6)


def test_jacfwd_through_a_cenlmc_run_is_finite_at_n_1000():
    build, _, _ = SAMPLERS["cenlmc"]

    def final_mean(mu):
        algo = build(mu)
        x0 = jax.random.normal(jax.random.key(0), (1000, 2))
        res = cj.sample(jax.random.key(2), algo, algo.init(x0), 5, mode="stream")
        return res.moments.mean

    jac = jax.jacfwd(final_mean)(jnp.float32(0.3))
    assert bool(jnp.all(jnp.isfinite(jac))), jac


def test_f_star_may_be_traced():
    def final(fs):
        algo = cj.cenlmc(shifted(0.0), 0.05, 0.8, 0.5, 0.5, 2, 10.0, f_star=fs)
        x0 = jax.random.normal(jax.random.key(0), (64, 2))
        return cj.sample(
            jax.random.key(1), algo, algo.init(x0), 3, mode="stream"
        ).moments.mean[0]

    assert np.isfinite(
        float(jax.grad(final)(jnp.float32(0.0)))
    )  # (zero: f* only enters a test)


# ------------------------------------------- reverse mode through the tiled and
# block-sparse pair kernels
#
# Above N = 64 ``method="auto"`` sums the ensemble force with the tiled kernel, and from
# N = 8,192 (d <= 3) with its block-sparse form; the runs above (32 particles) take the
# dense one. Here N = 200 with each kernel named explicitly. The block-sparse call runs
# its sparse branch only where the visited tile pairs fit its list (else the dense
# tiles, exactly); at N = 200 the 32-particle column tiles cover most of a 2-D cloud, so
# it would hand over at every step, while on a line the tiles are intervals: with 16-row
# tiles and η = R2 = 0.4 the sparse branch runs at every step (asserted, so the test is
# not the dense one again).

# kernel -> (ensemble_force options, dimension, eta, r2)
KERNELS = {
    "tiled": (dict(method="tiled"), 2, 0.8, 0.5),
    "block_sparse": (
        dict(method="tiled", block_sparse=True, block_size=16),
        1,
        0.4,
        0.4,
    ),
}
STEPS = {"enlmc": 5, "cenlmc": 20}  # as in SAMPLERS


def ensemble_sampler(name, kernel, mu):
    # dense_grad: every gradient computed, then selected (the same run; the compacted
    # gradient calls are tested above with the dense kernel, and would double the
    # compilation here)
    opts, _, eta, r2 = KERNELS[kernel]
    if name == "enlmc":
        return cj.enlmc(shifted(mu), 0.05, eta, audit_size=0, dense_grad=True, **opts)
    return cj.cenlmc(
        shifted(mu), 0.05, eta, 0.5, r2, 2, 10.0, f_star=0.0, dense_grad=True, **opts
    )


def run_ensemble(name, kernel, mu):
    """A float64 run of 200 particles: (mean of coordinate 0 over the run, per-step
    infos, the states stepped from).

    The states are ``(x, f, log p, w)`` stacked over the steps (the initial one, then
    all but the last).
    """
    algo = ensemble_sampler(name, kernel, mu)
    x0 = jax.random.normal(jax.random.key(0), (200, KERNELS[kernel][1]), jnp.float64)
    state = algo.init(x0, jax.random.key(1))
    fields = lambda s: (s.position, -s.logdensity, s.log_p, s.w)  # noqa: E731
    res = cj.sample(
        jax.random.key(2), algo, state, STEPS[name], trace_fn=fields, info_reduce=None
    )
    states = [
        jnp.concatenate([a[None], b[:-1]])
        for a, b in zip(fields(state), res.trace, strict=True)
    ]
    return jnp.mean(res.trace[0][..., 0]), res.info, states


@functools.partial(jax.jit, static_argnames=("with_w", "block_rows"))
def sparse_branch_taken(x, f, log_p, w, eta, r2, *, with_w, block_rows):
    """Per state (stacked ``(steps, N, ...)``), whether the block-sparse call folds its
    list of tile pairs (True) or hands over to the dense tiles."""

    def one(x, f, log_p, w):
        _, p = sort_spatially(
            prepare(x, f, log_p, eta, w if with_w else None, r2 if with_w else None)
        )
        spec = tile_spec(x.shape[1], x.dtype)
        capacity = sparse_capacity(x.shape[0], block_rows, SPARSE_BLOCK_COLS)
        plan = sparse_plan(p, block_rows, SPARSE_BLOCK_COLS, capacity, spec)
        return plan.fits & column_weights(p, spec).shared

    return jax.vmap(one)(x, f, log_p, w)


# EnLMC's block-sparse sums (the x-ball alone) fold CEnLMC's loop with the tile code of
# EnLMC's tiled run; a test of their own would cost three more compilations.
@pytest.mark.parametrize(
    "name, kernel",
    [("enlmc", "tiled"), ("cenlmc", "tiled"), ("cenlmc", "block_sparse")],
)
def test_pathwise_derivative_through_the_tiled_pair_kernels(name, kernel):
    with jax.enable_x64(True):
        # ε 100x smaller than above: N = 200 makes ~40x more pairs per step, each a mask
        # decision that must not flip between μ - ε and μ + ε; float64 rounding of the
        # difference, ~1e-16/ε = 1e-9, stays far below the tolerance
        mu0, eps = 0.3, 1e-7
        grad = float(
            jax.grad(lambda m: run_ensemble(name, kernel, m)[0])(jnp.float64(mu0))
        )
        (hi, info_hi, states), (lo, info_lo, _) = (
            run_ensemble(name, kernel, mu0 + eps),
            run_ensemble(name, kernel, mu0 - eps),
        )
        # the discrete decisions must be the same on both sides, or the finite
        # difference is not pathwise (besides the tests, the neighbour counts: a pair
        # crossing η or R2 would change them)
        for field in (
            "grad_evals",
            "ensemble_fraction",
            "mean_num_neighbours",
            "mean_ball_neighbours",
            "num_isolated",
        ):
            if hasattr(info_hi, field):
                np.testing.assert_array_equal(
                    np.asarray(getattr(info_hi, field)),
                    np.asarray(getattr(info_lo, field)),
                )
        fd = (float(hi) - float(lo)) / (2 * eps)
        assert np.isfinite(grad), grad
        np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-6)  # as above
        if kernel == "block_sparse":
            _, _, eta, r2 = KERNELS[kernel]
            taken = sparse_branch_taken(
                *states, eta, r2, with_w=name == "cenlmc", block_rows=16
            )
            assert bool(jnp.all(taken)), taken


# ------------------------------------------------------------ reverse mode through
# ensemble_force itself
#
# L = Σ c ⊙ force_sum for a fixed random c: linear in the force, so its cotangent is
# exactly c for every kernel (a nonlinear L would carry each kernel's forward rounding
# into its cotangent, scaled by |force|), and the kernels' gradients differ only by the
# rounding of their pair terms, bounded below.


def _force_tiled(
    x, f, log_p, eta, w, r2
):  # one column tile: row blocks of 208 for 203 particles
    return ensemble_force(x, f, log_p, eta, w=w, r2=r2, method="tiled")


def _force_block_sparse(
    x, f, log_p, eta, w, r2
):  # the sparse branch whatever the fill (max_active=1)
    return ensemble_force_tiled(
        x,
        f,
        log_p,
        eta,
        w=w,
        r2=r2,
        block_sparse=True,
        block_size=16,
        block_cols=16,
        group=8,
        max_active=1.0,
    )


FORCES = {
    "dense": lambda x, f, log_p, eta, w, r2: ensemble_force(
        x, f, log_p, eta, w=w, r2=r2, method="dense"
    ),
    "tiled": _force_tiled,
    "block_sparse": _force_block_sparse,
}


@functools.partial(jax.jit, static_argnames=("kernel",))
def force_gradients(x, f, log_p, w, eta, r2, c, *, kernel):
    """``∂L/∂(x, f, log p, w)`` for ``L = Σ c ⊙ force_sum``, and the counts ``(n_ball,
    n_r2)``."""

    def loss(x, f, log_p, w):
        out = FORCES[kernel](x, f, log_p, eta, w, r2)
        return jnp.sum(c * out.force_sum), (out.n_ball, out.n_r2)

    return jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(x, f, log_p, w)


def gradient_rounding_bound(x, f, log_p, eta, w, r2, c, ref, *, gram):
    """Per particle, bounds on how far two float64 evaluations of ``∂L/∂x_k``,
    ``∂L/∂f_k``, ``∂L/∂log p_k`` may differ.

    ``L = Σ_i c_i · Σ_j T_ij``, ``T_ij = s_j g_ij (x_j - x_i)``, ``g_ij = (f_j -
    f_i)/d²_ij``. Per used pair, the derivatives of ``c_i · T_ij`` have magnitudes at
    most ``|c_i| |s_j g_ij|`` (by ``x_i``, ``x_j``), ``|c_i| s_j / r_ij`` (by ``f_i``,
    ``f_j``) and ``|c_i| |T_ij|`` (by ``log p_j``), each with a relative rounding error
    of about ``ε (L + 2D + 2X)``: ``L``, ``D``, ``X`` as in
    ``test_pairwise.assert_matches_oracle`` (the exponent of the weight, the distance
    error, the centred difference), ``D`` and ``X`` twice because the derivative divides
    by ``d²`` once more. A particle's bound sums those of the pairs it is in, times 8
    (both evaluations err, and a few roundings per term: a safety factor, not a fit).

    Two derivatives are zero in exact arithmetic and rounding residues in float (given
    the reference gradients ``ref``): by the centre the tiled kernels subtract
    (translation invariance), which every valid particle's ``x`` receives as ``1/N`` of
    a sum over all of them, and by the shift of the weights (their largest log weight),
    which the ``log p`` of the particle setting it receives whole. So ``x`` gets the
    mean of the ``x`` bounds, ``log p`` the sum of the ``log p`` bounds, and each
    argument ``8 ε Σ_k |∂L/∂a_k|`` (an N-term sum rounds by about ``N ε Σ|terms|``, over
    N for the centre).
    """
    x, f, log_p, c = (np.asarray(a, np.float64) for a in (x, f, log_p, c))
    n, d = x.shape
    eps = float(np.finfo(np.float64).eps)
    valid_w = (
        np.ones(n, bool) if w is None else np.all(np.isfinite(np.asarray(w)), axis=1)
    )
    valid = (
        np.all(np.isfinite(x), axis=1) & np.isfinite(f) & np.isfinite(log_p) & valid_w
    )
    xc = np.where(valid[:, None], x - x[valid].mean(axis=0), 0.0)
    sq = np.sum(xc**2, axis=1)
    d2 = np.sum((xc[None, :, :] - xc[:, None, :]) ** 2, axis=-1)
    use = valid[:, None] & valid[None, :] & ~np.eye(n, dtype=bool) & (d2 <= eta**2)
    if w is not None:
        w0 = np.where(valid_w[:, None], np.asarray(w, np.float64), 0.0)
        use &= np.sum((w0[None, :, :] - w0[:, None, :]) ** 2, axis=-1) <= r2**2
    t = sq[:, None] + sq[None, :]
    kappa = (2 * d + 4) * eps
    # both kernels use the same pairs: none is near the Gram identity's coincidence
    # bound
    assert (
        not np.any(use & (d2 <= 2 * kappa * t)) if gram else not np.any(use & (d2 == 0))
    )
    log_alpha = math.log(d) - (
        0.5 * d * math.log(math.pi) + d * math.log(eta) - math.lgamma(0.5 * d + 1)
    )
    safe_d2 = np.where(use, d2, 1.0)
    g = np.where(use, (f[None, :] - np.where(valid, f, 0)[:, None]) / safe_d2, 0.0)
    log_s = np.where(valid, log_alpha - np.where(valid, log_p, 0), 0.0)
    s = np.exp(log_s)[None, :]
    L = (
        abs(log_alpha)
        + np.abs(log_s)[None, :]
        + np.abs(np.log(np.where(g != 0, np.abs(g), 1)))
        + 4
    )
    D = kappa * t / safe_d2 if gram else 2 * (d + 1)
    X = (np.sqrt(sq)[:, None] + np.sqrt(sq)[None, :]) / np.sqrt(safe_d2)
    rel = np.where(use, eps * (L + 2 * D + 2 * X), 0.0)
    cn = np.linalg.norm(c, axis=1)[:, None]
    by_x, by_f, by_log_p = (
        cn * m * rel
        for m in (np.abs(s * g), s / np.sqrt(safe_d2), np.abs(s * g) * np.sqrt(d2))
    )
    both = lambda e: 8 * (e.sum(axis=0) + e.sum(axis=1))  # noqa: E731  pair (i, j) enters rows i and j
    bx, bf, bl = both(by_x), both(by_f), 8 * by_log_p.sum(axis=0)
    sums = [8 * eps * np.sum(np.abs(np.asarray(r))) for r in ref]
    return bx + bx.sum() / valid.sum() + sums[0], bf + sums[1], bl + bl.sum() + sums[2]


# (kernel, d, with w, one particle's weight e^-700 below the others: beyond one shared
# shift (688 nats in float64), so each row takes its own shift). d = 2: exact
# differences; d = 5: the Gram identity. With w: CEnLMC's x-ball and R2 test (and,
# block-sparse, tiles visited for the R2 count only); EnLMC's x-ball alone is the same
# tile code without the R2 mask (the runs above).
FORCE_CASES = [("tiled", 5, True, True), ("block_sparse", 2, True, False)]


@pytest.mark.parametrize("kernel, d, with_w, spread", FORCE_CASES)
def test_reverse_mode_through_ensemble_force_equals_the_dense_kernel(
    kernel, d, with_w, spread
):
    """``jax.grad`` through the tiled / block-sparse pair sums: finite, and the dense
    kernel's gradient to rounding, with 203 particles (no multiple of any tile),
    non-finite x, f, log p and w = +inf rows."""
    with jax.enable_x64(True):
        n = 203
        x, f, log_p, w = lmc_like_ensemble(7, n, d, dtype=np.float64)
        # four clusters 8 apart along the first axis: the block-sparse list skips the
        # tile pairs between them
        x[:, 0] += 8.0 * (np.arange(n) % 4)
        w[:, 0] += 8.0 * (np.arange(n) % 4)
        # the median of 203 distances is one of them: 1.001 moves the radii off every
        # pair's threshold
        eta, r2 = 1.001 * eta_for_neighbours(x, 15), 1.001 * eta_for_neighbours(w, 40)
        w[[3, 40]] = np.inf  # CEnLMC's initial w
        x[7, 0] = np.nan
        f[11] = np.inf
        log_p[19] = np.nan
        if spread:
            log_p[23] += 700.0
        if not with_w:
            w, r2 = None, None
        c = np.random.default_rng(8).normal(size=(n, d))
        got, (n_ball, n_r2) = force_gradients(x, f, log_p, w, eta, r2, c, kernel=kernel)
        ref, (ref_ball, ref_r2) = force_gradients(
            x, f, log_p, w, eta, r2, c, kernel="dense"
        )
        # the same pairs on both sides (no pair within rounding of η or R2), so only
        # rounding differs
        np.testing.assert_array_equal(np.asarray(n_ball), np.asarray(ref_ball))
        np.testing.assert_array_equal(np.asarray(n_r2), np.asarray(ref_r2))
        for a in got[:3]:
            assert np.all(np.isfinite(np.asarray(a)))
        if (
            with_w
        ):  # w only decides masks: no derivative, and no NaN from the w = +inf rows
            assert np.all(np.asarray(got[3]) == 0) and np.all(np.asarray(ref[3]) == 0)
        bounds = gradient_rounding_bound(
            x, f, log_p, eta, w, r2, c, ref[:3], gram=d > DIRECT_MAX_D
        )
        for name, a, b, bound in zip(
            ("x", "f", "log_p"), got[:3], ref[:3], bounds, strict=True
        ):
            err = np.abs(np.asarray(a) - np.asarray(b))
            err = err.max(axis=1) if err.ndim == 2 else err
            assert np.all(err <= bound), (name, float(np.max(err / bound)))
            # not vacuous: the bound is far below the gradient itself
            assert np.max(bound) < 1e-6 * np.max(np.abs(np.asarray(b))), name
        for bad in (7, 11, 19) + (
            (3, 40) if with_w else ()
        ):  # non-finite rows: no derivative
            assert (
                np.all(np.asarray(got[0][bad]) == 0)
                and float(got[1][bad]) == 0
                and float(got[2][bad]) == 0
            )
        # the intended branches ran: the spread forced a shift per row, the block-sparse
        # list skipped tiles
        valid = np.all(np.isfinite(x), axis=1) & np.isfinite(f) & np.isfinite(log_p)
        valid &= True if w is None else np.all(np.isfinite(w), axis=1)
        assert (np.ptp(log_p[valid]) > max_shared_spread(np.float64)) == spread
        if kernel == "block_sparse":
            assert 0 < visited_tile_pairs(x, f, log_p, w, eta, r2) < (-(-n // 16)) ** 2


@jax.jit
def visited_tile_pairs(x, f, log_p, w, eta, r2):
    """How many of the 16 x 16 tile pairs the block-sparse list of
    ``_force_block_sparse`` holds."""
    n, d = x.shape
    _, p = sort_spatially(prepare(x, f, log_p, eta, w, r2))
    return sparse_plan(p, 16, 16, (-(-n // 16)) ** 2, tile_spec(d, x.dtype)).n_pairs
