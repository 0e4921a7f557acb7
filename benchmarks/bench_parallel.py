"""Many-chain convergence (issue 29 item 3): LAPS, MEADS, ChEES, NUTS and ours.

The metric is the LAPS paper's (Robnik & Seljak): on the *instantaneous* ensemble
(all chains at one time)

    b2_i = (E_ens[x_i^2] - E[x_i^2])^2 / Var[x_i^2],    b2max = max_i b2_i,

and each method is charged its **sequential gradient evaluations per chain**,
warm-up included, until b2max < 0.01: the *first* crossing, and the *settled*
crossing (the first point after which b2max stays < 0.01 to the end of the run,
counted only when that tail is at least the last quarter of the run; the run is
capped at ``budget`` sequential gradients per chain, ``run_over_first`` in the JSON
says whether it was at least 4x the first crossing). Also: the final b2max (a plateau
above 0.01 is a biased or stuck method), total gradients over all chains, and the
wall time of the method's one run (compilation included).

Targets (data from fixed seeds, nothing downloaded):

  gaussian100  100-d Gaussian, covariance Q diag(logspace(-2, 2)) Q^T (variances
               1e-2..1e2, condition number 1e4), Q a random rotation (seed 1);
               E[x^2] = diag(Sigma), Var[x^2] = 2 diag(Sigma)^2 exact.
  banana       x0 ~ N(0, 10^2), x1 | x0 ~ N(0.03 (x0^2 - 100), 1) (Inference Gym);
               E[x^2] = (100, 19), Var[x^2] = (2e4, 4610) exact.
  logreg25     logistic regression, 25 coefficients, 1,000 synthetic rows (seed 2),
               N(0, 1) prior; E[x^2], Var[x^2] from a long BlackJAX NUTS run.
  kidiq        posteriordb kidiq-kidscore_momiq; eight_schools: posteriordb
               eight_schools-eight_schools_noncentered. posteriordb's references are
               means and sds of the *constrained* parameters, not E[x^2] and Var[x^2]
               of the unconstrained coordinates the samplers run in: those come from
               a long NUTS run here too (its constrained means are checked against
               posteriordb's in the JSON).

The reference NUTS run: window adaptation (dense metric, one chain) then vmapped
NUTS chains from the adapted state, pooled after a burn-in; computed at the start
of each target (seconds), never cached.

Methods (rows); all start from the same Uniform(-2, 2) draws (Stan's default
initialisation, seed 0), except LAPS, which draws its own from the same
distribution (its ``sample_init`` gets a key, not a position):

  laps       ``blackjax.adaptation.laps.laps`` with its defaults;
             ``num_steps1 = num_steps2 = budget / 2`` (it takes both; phase 1 stops
             early on its own criterion). ``observables_for_bias = x^2`` and
             ``contract`` = b2 (LAPS's own ``bias(model)`` helper), so its per-step
             diagnostics are this metric. Grads: 1 at the start, 1 per phase-1 step,
             ``steps_per_sample * len(coefficients) // 2`` per phase-2 sample.
  meads      ``blackjax.meads_adaptation`` (``budget / 4`` steps, b2 recorded every
             step via ``adaptation_info_fn``) then ``blackjax.ghmc``: 1 grad a step.
  chees      ``blackjax.chees_adaptation`` (step size 0.1, ``optax.adam(0.025)``,
             ``budget / 20`` steps) then ``blackjax.dynamic_hmc``; grads: the
             ``num_integration_steps`` of each step (the same for all chains: the
             jitter is a shared Halton sequence).
  nuts       ``blackjax.window_adaptation`` (diagonal, the default) on ONE chain
             (per-chain adaptation of 1,024 chains is what a user would not do),
             then ``blackjax.nuts`` vmapped over all chains with the shared step
             size and metric, from the common initial positions. Charged: the
             adaptation chain's gradients, then the mean over chains of
             ``num_integration_steps`` per step (``lockstep`` in the JSON: the max
             over chains, what a vmapped run waits for).
  ours_lmc   ``cj.langevin_warmup(key, logp, x0, sampler="lmc")`` + ``cj.sample``.
  ours_default  ``cj.langevin_warmup(key, logp, x0)`` with its default sampler at
             run time (``algorithm`` in the JSON) + ``cj.sample``.
             Ours are charged the warm-up (``info.sequential_grads`` when set,
             >= 0: the LMC path leaves it at -1; else ``grad_evals / N +
             lbfgs_steps``; the JSON says which; the curvature estimates'
             Hessian-vector products are listed apart) and
             then gradients per sampling step (``info.grad_evals`` per particle, 1
             for LMC). The warm-up's trajectory is not observed: if b2max is below
             0.01 at its end, the first crossing is the warm-up cost, an upper bound
             (``first_is_upper_bound``).

Noise floor: with N chains, even exact independent draws give b2_i ~ chi2_1 / N,
and the max over d coordinates is about (2 log d) / N: for N = 1,024 and d = 100
about 0.009, on the threshold. The ``floor`` fields give, per target, the median
and 95th percentile of b2max over 200 ensembles of N exact (or reference-resampled)
draws and the fraction below 0.01: a settled crossing may be unreachable for any
sampler where that fraction is well below 1.

Run: ``python benchmarks/bench_parallel.py --size full`` (``--size small``: 128
chains, budget 1,000, a smoke check). ``--methods ours_default --targets logreg25``
reruns those rows alone, merged into the table already in ``--out-dir`` (``--fresh``:
not merged). Needs BlackJAX 1.7.1 (the bench extra).
Results are written after every target (partial runs keep what finished).
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import time
import traceback

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _common import base_parser, write_results  # noqa: E402

try:
    import blackjax
    import optax
    from blackjax.adaptation.laps import laps
except ImportError:  # an optional peer: say how to get it, and do not fail run_all
    print(
        "bench_parallel.py needs BlackJAX: pip install 'blackjax==1.7.1' (the bench "
        "extra); skipped."
    )
    sys.exit(0)

import cenlmc_jax as cj  # noqa: E402
from cenlmc_jax.models import posteriordb  # noqa: E402

THRESHOLD = 0.01
SETTLED_TAIL = 0.75  # a settled crossing leaves >= 1/4 of the run below
HELD_X = 5.0  # issue 29: below from the first crossing g through 5 g (4x more steps)
SIZES = {
    # chains, sequential-gradient budget per chain, reference NUTS (chains, draws,
    # adaptation), NUTS adaptation steps, our warm-up steps (None: its default),
    # wall-time cap per method (s)
    "small": dict(
        chains=128,
        budget=1000,
        ref=(8, 400, 300),
        nuts_warmup=150,
        our_warmup=250,
        wall_cap=300.0,
    ),
    "full": dict(
        chains=1024,
        budget=4000,
        ref=(16, 1000, 600),
        nuts_warmup=500,
        our_warmup=None,
        wall_cap=400.0,
    ),
}
METHODS = ("laps", "meads", "chees", "nuts", "ours_lmc", "ours_default")


# ------------------------------------------------------------------- the targets


def gaussian_target(d=100):
    q, _ = jnp.linalg.qr(jax.random.normal(jax.random.key(1), (d, d)))
    lam = jnp.logspace(-2.0, 2.0, d)
    cov = (q * lam) @ q.T
    prec = (q / lam) @ q.T
    ex2 = jnp.diag(cov)
    chol = jnp.linalg.cholesky(cov)
    return dict(
        logdensity=lambda x: -0.5 * x @ (prec @ x),
        d=d,
        ex2=ex2,
        varx2=2.0 * ex2**2,
        exact=lambda k, n: jax.random.normal(k, (n, d)) @ chol.T,
        reference="exact",
    )


def banana_target():
    def logdensity(x):
        return -0.5 * (x[0] / 10.0) ** 2 - 0.5 * (x[1] - 0.03 * (x[0] ** 2 - 100)) ** 2

    def exact(k, n):
        z = jax.random.normal(k, (n, 2))
        x0 = 10.0 * z[:, 0]
        return jnp.stack([x0, 0.03 * (x0**2 - 100) + z[:, 1]], 1)

    # x1 = 3 (z^2 - 1) + e: E[x1^2] = 9 * 2 + 1, E[x1^4] = 81 * 60 + 6 * 18 + 3
    return dict(
        logdensity=logdensity,
        d=2,
        ex2=jnp.array([100.0, 19.0]),
        varx2=jnp.array([2e4, 4971.0 - 19.0**2]),
        exact=exact,
        reference="exact",
    )


def logreg_target(d=25, rows=1000):
    kx, kb, ky = jax.random.split(jax.random.key(2), 3)
    x = jax.random.normal(kx, (rows, d))
    beta = 0.5 * jax.random.normal(kb, (d,))
    y = jax.random.bernoulli(ky, jax.nn.sigmoid(x @ beta)).astype(jnp.float64)

    def logdensity(b):
        z = x @ b
        return jnp.sum(y * z - jax.nn.softplus(z)) - 0.5 * b @ b

    return dict(logdensity=logdensity, d=d, reference="nuts")


def posteriordb_target(name):
    post = posteriordb.load(name)
    return dict(
        logdensity=post.logdensity_fn,
        d=post.d,
        reference="nuts",
        posterior=post,
    )


TARGETS = {  # cheapest first: a run cut short keeps the most targets
    "banana": banana_target,
    "kidiq": lambda: posteriordb_target("kidiq-kidscore_momiq"),
    "eight_schools": lambda: posteriordb_target(
        "eight_schools-eight_schools_noncentered"
    ),
    "gaussian100": gaussian_target,
    "logreg25": logreg_target,
}


def initial_positions(n, d, seed=0):
    return jax.random.uniform(jax.random.key(seed), (n, d), minval=-2.0, maxval=2.0)


def b2_of(m2, t):
    """b2_i of ensemble second moments ``m2`` (..., d)."""
    return (m2 - t["ex2"]) ** 2 / t["varx2"]


def b2max_of(m2, t):
    return np.asarray(jnp.max(b2_of(jnp.asarray(m2), t), -1), np.float64)


# ------------------------------------------------------------- the reference


def nuts_reference(t, cfg):
    """E[x^2], Var[x^2] (and the pooled draws) from a long NUTS run."""
    chains, draws, warm = cfg["ref"]
    logp, d = t["logdensity"], t["d"]
    t0 = time.perf_counter()
    x0 = initial_positions(1, d)[0]
    wa = blackjax.window_adaptation(blackjax.nuts, logp, is_mass_matrix_diagonal=False)
    (state, params), _ = wa.run(jax.random.key(10), x0, num_steps=warm)
    nuts = blackjax.nuts(logp, **params)
    states = jax.tree_util.tree_map(
        lambda a: jnp.broadcast_to(a, (chains,) + a.shape), state
    )
    burn = draws // 10

    @jax.jit
    def run(key, states):
        def body(st, k):
            st, info = jax.vmap(nuts.step)(jax.random.split(k, chains), st)
            return st, (st.position, info.num_integration_steps)

        return lax.scan(body, states, jax.random.split(key, burn + draws))

    _, (pos, steps) = run(jax.random.key(11), states)
    pos = np.asarray(pos[burn:], np.float64)  # (draws, chains, d)
    flat = pos.reshape(-1, d)
    x2 = flat**2
    # R-hat of x^2 over the reference chains (a check that they agree)
    rhat = blackjax.diagnostics.potential_scale_reduction(
        jnp.swapaxes(jnp.asarray(pos**2), 0, 1)
    )
    info = dict(
        chains=chains,
        draws_per_chain=draws,
        burn_in=burn,
        adaptation_steps=warm,
        metric="dense",
        step_size=float(params["step_size"]),
        mean_integration_steps=float(np.mean(np.asarray(steps))),
        max_rhat_x2=float(jnp.max(rhat)),
        seconds=time.perf_counter() - t0,
    )
    post = t.get("posterior")
    if post is not None:
        cm = np.asarray(jax.vmap(post.constrain_array)(jnp.asarray(flat[::10])))
        info["constrained_mean_vs_posteriordb_z"] = dict(
            zip(
                post.names,
                ((cm.mean(0) - post.ref_mean) / post.ref_sd).round(3).tolist(),
                strict=True,
            )
        )
    return jnp.asarray(x2.mean(0)), jnp.asarray(x2.var(0)), flat, info


def noise_floor(t, n, reps=200):
    """b2max of ``reps`` ensembles of ``n`` exact (or reference-resampled) draws."""
    keys = jax.random.split(jax.random.key(7), reps)
    if "exact" in t:
        m2 = jnp.stack([jnp.mean(t["exact"](k, n) ** 2, 0) for k in keys])
    else:
        pool = jnp.asarray(t["draws"])
        idx = jax.vmap(lambda k: jax.random.choice(k, pool.shape[0], (n,)))(keys)
        m2 = jnp.mean(pool[idx] ** 2, 1)
    b = b2max_of(m2, t)
    return dict(
        median=float(np.median(b)),
        p95=float(np.quantile(b, 0.95)),
        fraction_below=float(np.mean(b < THRESHOLD)),
        source="exact draws" if "exact" in t else "resampled reference draws",
    )


# ------------------------------------------------------------------ crossings


def crossings(grads, b2, upper_bound_first=False):
    """First and settled crossing of ``b2 < THRESHOLD`` along ``grads``."""
    grads, b2 = np.asarray(grads, np.float64), np.asarray(b2, np.float64)
    below = np.isfinite(b2) & (b2 < THRESHOLD)
    out = dict(
        first=None,
        settled=None,
        run_grads=float(grads[-1]),
        final_b2max=float(b2[-1]),
        min_b2max=float(np.nanmin(b2)),
        first_is_upper_bound=False,
    )
    if below.any():
        i = int(np.argmax(below))
        out["first"] = float(grads[i])
        out["first_is_upper_bound"] = bool(upper_bound_first and i == 0)
        bad = np.flatnonzero(~below)
        j = 0 if bad.size == 0 else int(bad[-1]) + 1
        if j < len(b2):
            out["settled_raw"] = float(grads[j])
            # settled: below for at least the last quarter of the run, not only at
            # its last few points
            if grads[j] <= grads[0] + SETTLED_TAIL * (grads[-1] - grads[0]):
                out["settled"] = float(grads[j])
        out["run_over_first"] = float(grads[-1] / max(grads[i], 1.0))
        out["fraction_below_after_first"] = float(np.mean(below[i:]))
        out.update(held(grads[i:], below[i:]))
    return out


def held(grads, below):
    """How long b2max stays below after its first crossing (``grads[0]``, ``below[0]``
    true): ``first_excursion`` (the first point back above, or None) and ``held_x``,
    that point (or the run's end) over the first crossing. Issue 29's "staying there
    over 4x more steps": ``held_x >= HELD_X`` (4x more steps after the crossing)."""
    above = np.flatnonzero(~np.asarray(below))
    end = float(grads[above[0]]) if above.size else None
    first = max(float(grads[0]), 1.0)
    return dict(
        first_excursion=end,
        held_x=(float(grads[-1]) if end is None else end) / first,
        held_to_end=end is None,
    )


# ------------------------------------------------------------ the samplers


def lockstep_runner(step, n_chains, n_steps, grads_fn):
    """jit((key, states) -> (states, (E_ens[x^2], mean grads, max grads))): a scan
    of ``step`` vmapped over the chains."""
    vstep = jax.vmap(step)

    @jax.jit
    def run(key, states):
        def body(st, k):
            st, info = vstep(jax.random.split(k, n_chains), st)
            g = grads_fn(info)
            return st, (jnp.mean(st.position**2, 0), jnp.mean(g), jnp.max(g))

        return lax.scan(body, states, jax.random.split(key, n_steps))

    return run


def run_lockstep(step, states, key, start_grads, cfg, grads_fn, chunk, t_start):
    """Chunks of ``lockstep_runner`` until ``budget`` mean sequential grads per chain
    or the wall-time cap; returns the trajectory pieces."""
    n = jax.tree_util.tree_leaves(states)[0].shape[0]
    run = lockstep_runner(step, n, chunk, grads_fn)
    m2s, gm, gx = [], [], []
    done, done_max, i = start_grads, start_grads, 0
    stopped = "budget"
    # at least a quarter budget after the warm-up, even when the warm-up exceeds it
    while done < max(cfg["budget"], start_grads + cfg["budget"] / 4):
        if time.perf_counter() - t_start > cfg["wall_cap"]:
            stopped = "wall-time cap"
            break
        states, (m2, g_mean, g_max) = run(jax.random.fold_in(key, i), states)
        m2s.append(np.asarray(m2))
        gm.append(np.asarray(g_mean))
        gx.append(np.asarray(g_max))
        done += float(np.sum(gm[-1]))
        done_max += float(np.sum(gx[-1]))
        i += 1
    m2 = np.concatenate(m2s) if m2s else np.zeros((0, 1))
    g_mean = start_grads + np.cumsum(np.concatenate(gm)) if gm else np.zeros(0)
    g_max = start_grads + np.cumsum(np.concatenate(gx)) if gx else np.zeros(0)
    return m2, g_mean, g_max, stopped


def method_laps(t, x0, key, cfg):
    n, d = x0.shape
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("chains",))
    half = cfg["budget"] // 2
    info, gps, acc, _ = laps(
        t["logdensity"],
        lambda k: jax.random.uniform(k, (d,), minval=-2.0, maxval=2.0),
        d,
        half,
        half,
        n,
        mesh,
        key,
        observables_for_bias=lambda x: x**2,
        contract=lambda m2: jnp.array([jnp.max(b2_of(m2, t)), jnp.mean(b2_of(m2, t))]),
    )
    b1 = np.asarray(info["phase_1"]["bias"])[:, 0]
    b2 = np.asarray(info["phase_2"]["bias"])[:, 0]
    per_sample = 15 * gps  # steps_per_sample (its default) x grads per step
    grads = np.concatenate(
        [
            1.0 + np.arange(1, len(b1) + 1),
            1.0 + len(b1) + per_sample * np.arange(1, 1 + len(b2)),
        ]
    )
    return dict(
        grads=grads,
        b2max=np.concatenate([b1, b2]),
        total_grads=n * grads[-1],
        extra=dict(
            phase1_steps=len(b1),
            phase2_samples=len(b2),
            grads_per_phase2_sample=per_sample,
            acc_prob_target=acc,
            final_step_size=float(np.asarray(info["phase_2"]["step_size"])[-1]),
            final_acc_prob=float(np.asarray(info["phase_2"]["acc_prob"])[-1]),
            num_steps1=half,
            num_steps2=half,
        ),
    )


def method_meads(t, x0, key, cfg, t_start):
    n = x0.shape[0]
    warm_steps = cfg["budget"] // 4
    k1, k2 = jax.random.split(key)
    meads = blackjax.meads_adaptation(
        t["logdensity"],
        n,
        adaptation_info_fn=lambda s, i, a: jnp.mean(s.position**2, 0),
    )
    (states, params), m2_warm = meads.run(k1, x0, warm_steps)
    ghmc = blackjax.ghmc(t["logdensity"], **params)
    m2, g_mean, _, stopped = run_lockstep(
        ghmc.step,
        states,
        k2,
        warm_steps + 1.0,
        cfg,
        lambda info: jnp.ones(n),
        250,
        t_start,
    )
    grads = np.concatenate([1.0 + np.arange(1, warm_steps + 1), g_mean])
    return dict(
        grads=grads,
        b2max=b2max_of(np.concatenate([np.asarray(m2_warm), m2]), t),
        total_grads=n * grads[-1],
        extra=dict(
            warmup_steps=warm_steps,
            step_size=float(params["step_size"]),
            alpha=float(params["alpha"]),
            delta=float(params["delta"]),
            stopped=stopped,
        ),
    )


def method_chees(t, x0, key, cfg, t_start):
    n = x0.shape[0]
    warm_steps = max(cfg["budget"] // 20, 20)
    k1, k2 = jax.random.split(key)
    chees = blackjax.chees_adaptation(
        t["logdensity"],
        n,
        adaptation_info_fn=lambda s, i, a: (
            jnp.mean(s.position**2, 0),
            jnp.max(i.num_integration_steps),
        ),
    )
    (states, params), info = chees.run(
        k1,
        x0,
        step_size=0.1,
        optim=optax.adam(0.025),
        num_steps=warm_steps,
        max_sampling_steps=cfg["budget"],
    )
    m2_warm, steps_warm = (np.asarray(a) for a in info._wrapped_info)
    g_warm = 1.0 + np.cumsum(steps_warm)
    hmc = blackjax.dynamic_hmc(t["logdensity"], **params)
    m2, g_mean, g_max, stopped = run_lockstep(
        hmc.step,
        states,
        k2,
        float(g_warm[-1]),
        cfg,
        lambda info: info.num_integration_steps.astype(jnp.float64),
        25,
        t_start,
    )
    grads = np.concatenate([g_warm, g_mean])
    return dict(
        grads=grads,
        b2max=b2max_of(np.concatenate([m2_warm, m2]), t),
        total_grads=n * grads[-1],
        extra=dict(
            warmup_steps=warm_steps,
            warmup_grads=float(g_warm[-1]),
            step_size=float(params["step_size"]),
            num_leapfrog_steps=float(params["integration_steps_params"][0]),
            stopped=stopped,
        ),
    )


def method_nuts(t, x0, key, cfg, t_start):
    n = x0.shape[0]
    k1, k2 = jax.random.split(key)
    wa = blackjax.window_adaptation(blackjax.nuts, t["logdensity"])
    (_, params), winfo = wa.run(k1, x0[0], num_steps=cfg["nuts_warmup"])
    warm_grads = 1.0 + float(np.sum(np.asarray(winfo.info.num_integration_steps)))
    nuts = blackjax.nuts(t["logdensity"], **params)
    states = jax.vmap(nuts.init)(x0)
    m2, g_mean, g_max, stopped = run_lockstep(
        nuts.step,
        states,
        k2,
        warm_grads + 1.0,
        cfg,
        lambda info: info.num_integration_steps.astype(jnp.float64),
        10,
        t_start,
    )
    b2 = b2max_of(m2, t)
    b2_start = b2max_of(jnp.mean(x0**2, 0), t)
    return dict(
        grads=np.concatenate([[warm_grads + 1.0], g_mean]),
        b2max=np.concatenate([[b2_start], b2]),
        # the adaptation chain, then every chain's own integration steps
        total_grads=warm_grads + n * (g_mean[-1] - warm_grads - 1.0) + n,
        extra=dict(
            adaptation_steps=cfg["nuts_warmup"],
            adaptation_grads=warm_grads,
            step_size=float(params["step_size"]),
            sampling_steps=len(b2),
            lockstep_grads=float(g_max[-1]),
            stopped=stopped,
        ),
    )


def grads_per_step(info, n):
    """Gradients per particle of one sampling step, from the (mean-reduced) info."""
    g = getattr(info, "grad_evals", None)
    if g is None:
        return 1.0, "assumed 1 (no info.grad_evals)"
    g = float(np.mean(np.asarray(g)))
    return (g / n, "info.grad_evals / N") if g >= n else (g, "info.grad_evals")


def method_ours(t, x0, key, cfg, sampler):
    n, d = x0.shape
    k1, k2 = jax.random.split(key)
    kw = {} if sampler is None else {"sampler": sampler}
    if cfg["our_warmup"] is not None:
        kw["num_steps"] = cfg["our_warmup"]
    res = cj.langevin_warmup(k1, t["logdensity"], x0, **kw)
    info = res.info
    if getattr(info, "sequential_grads", -1) >= 0:  # -1: not filled in
        warm, how = float(info.sequential_grads), "info.sequential_grads"
    else:
        warm = info.grad_evals / n + info.lbfgs_steps
        how = "info.grad_evals / N + info.lbfgs_steps"
    seq_hvps = None
    if getattr(info, "hvp_evals", None) is not None:
        laplace = info.start == "laplace"
        seq_hvps = (info.hvp_evals - (d if laplace else 0)) / min(n, 16) + laplace
    algo = res.algorithm
    default = inspect.signature(cj.langevin_warmup).parameters["sampler"].default
    name = sampler or default
    steps = int(max(cfg["budget"] - warm, cfg["budget"] / 4))
    trace_fn = lambda s: jnp.mean(s.position**2, 0)  # noqa: E731
    try:
        out = cj.sample(
            k2, algo, res.state, steps, trace_fn=trace_fn, check_convergence=False
        )
        driver = "cj.sample(algorithm, state)"
    except Exception:  # a per-chain algorithm: batch it
        out = cj.sample(
            k2,
            cj.vmap_chains(algo),
            res.state,
            steps,
            trace_fn=trace_fn,
            check_convergence=False,
        )
        driver = "cj.sample(cj.vmap_chains(algorithm), state)"
    gps, gps_how = grads_per_step(out.info, n)
    m2 = np.asarray(out.trace)
    b2 = np.concatenate(
        [b2max_of(jnp.mean(res.positions**2, 0)[None], t), b2max_of(m2, t)]
    )
    grads = warm + gps * np.arange(0, len(m2) + 1)
    # the exact default records the ensemble's E[x^2] along its warm-up
    # (info.trajectory: after the Laplace start, after each of the kinetic phase's
    # first steps, then every 10 steps, after every tuning round): its first crossing
    # is then observed, not bounded
    traj = getattr(info, "trajectory", None)
    if traj:
        tg = np.array([float(k) for k, _, _ in traj])
        tb = b2max_of(np.stack([np.asarray(m2_) for _, _, m2_ in traj]), t)
        grads, b2 = np.concatenate([tg, grads]), np.concatenate([tb, b2])
    return dict(
        grads=grads,
        b2max=b2,
        total_grads=info.grad_evals + info.lbfgs_steps + n * gps * len(m2),
        upper_bound_first=not traj,
        extra=dict(
            algorithm=name,
            algorithm_repr=repr(algo)[:200],
            warmup_sequential_grads=warm,
            warmup_grads_how=how,
            warmup_sequential_hvps=seq_hvps,
            warmup_hvp_evals=getattr(info, "hvp_evals", None),
            lbfgs_steps=info.lbfgs_steps,
            warmup_start=getattr(info, "start", None),
            step_size=float(info.step_size),
            grads_per_sampling_step=gps,
            grads_per_step_how=gps_how,
            sampling_steps=len(m2),
            diverged_at=int(out.diverged_at),
            driver=driver,
        ),
    )


def run_method(method, t, x0, key, cfg):
    t0 = time.perf_counter()
    if method == "laps":
        r = method_laps(t, x0, key, cfg)
    elif method == "meads":
        r = method_meads(t, x0, key, cfg, t0)
    elif method == "chees":
        r = method_chees(t, x0, key, cfg, t0)
    elif method == "nuts":
        r = method_nuts(t, x0, key, cfg, t0)
    elif method == "ours_lmc":
        r = method_ours(t, x0, key, cfg, "lmc")
    else:
        r = method_ours(t, x0, key, cfg, None)
    wall = time.perf_counter() - t0
    c = crossings(r["grads"], r["b2max"], r.get("upper_bound_first", False))
    return dict(
        **c,
        total_grads=float(r["total_grads"]),
        wall_s=wall,
        **r["extra"],
        trajectory=thin_trajectory(r["grads"], r["b2max"]),
    )


def thin_trajectory(grads, b2, points=200):
    """At most ``points`` (grads, b2max) pairs of the trajectory, for plots."""
    idx = np.unique(
        np.linspace(0, len(b2) - 1, min(points, len(b2))).round().astype(int)
    )
    return [[float(grads[i]), float(b2[i])] for i in idx]


# ---------------------------------------------------------------------- output


def fmt_grads(v, upper=False):
    if v is None:
        return "never"
    return ("<= " if upper else "") + f"{v:,.0f}"


def fmt_held(r):
    """``held_x`` for the table: from the run's every point, or (rows measured before
    the column existed) from the JSON's thinned trajectory, marked ``~`` (a thinned
    trajectory can miss an excursion: an upper bound)."""
    if r.get("first") is None:
        return "-"
    h = r if "held_x" in r else None
    mark = ""
    if h is None and r.get("trajectory"):
        g, b = np.asarray(r["trajectory"], np.float64).T
        below = np.isfinite(b) & (b < THRESHOLD)
        if not below.any():
            return "-"
        i = int(np.argmax(below))
        h, mark = held(g[i:], below[i:]), "~"
    if h is None:
        return "-"
    text = f"{mark}{h['held_x']:.1f}x"
    return text + (" (to the end)" if h["held_to_end"] else "")


def md_row(r):
    return dict(
        target=r["target"],
        method=r["method"] + (f" ({r['algorithm']})" if r.get("algorithm") else ""),
        first=fmt_grads(r.get("first"), r.get("first_is_upper_bound")),
        settled=fmt_grads(r.get("settled")),
        run=fmt_grads(r.get("run_grads")),
        held=fmt_held(r),
        below_after_first=r.get("fraction_below_after_first"),
        final_b2max=r.get("final_b2max"),
        total_grads=None if r.get("total_grads") is None else f"{r['total_grads']:.3g}",
        wall_s=r.get("wall_s"),
        note=r.get("note", ""),
    )


COLUMNS = [
    "target",
    "method",
    "first",
    "settled",
    "run",
    "held",
    "below_after_first",
    "final_b2max",
    "total_grads",
    "wall_s",
    "note",
]


def merge_previous(rows, targets_info, done, args, cfg):
    """This run's rows merged into ``parallel.json`` as it is in ``--out-dir`` (a run
    of the same size): rows of a (target, method) this run did replace the old ones,
    the others are kept, so ``--methods ours_default`` reruns our rows alone.
    ``--fresh`` (or a file of another size) starts the table anew.
    """
    path = os.path.join(str(args.out_dir), "parallel.json")
    if args.fresh or not os.path.exists(path):
        return rows, targets_info, done
    with open(path) as fh:
        old = json.load(fh)
    if old.get("config") != json.loads(json.dumps(cfg)):
        return rows, targets_info, done
    ran = {(r["target"], r["method"]) for r in rows}
    kept = [r for r in old.get("rows", []) if (r["target"], r["method"]) not in ran]
    order = {name: i for i, name in enumerate(TARGETS)}
    rank = {name: i for i, name in enumerate(METHODS)}
    merged = sorted(
        kept + list(rows),
        key=lambda r: (order.get(r["target"], 99), rank.get(r["method"], 99)),
    )
    info = {**old.get("targets", {}), **targets_info}
    names = set(done) | set(old.get("targets_done", []))
    return merged, info, [n for n in TARGETS if n in names]


def write(rows, targets_info, args, cfg, done):
    ran = len(rows)
    rows, targets_info, done = merge_previous(rows, targets_info, done, args, cfg)
    command = None
    if len(rows) > ran:
        argv = list(sys.argv[1:])
        if "--note" in argv:  # the note is in the table already
            i = argv.index("--note")
            del argv[i : i + 2]
        this = " ".join(["python", os.path.relpath(sys.argv[0])] + argv)
        command = (
            f"{this}` for this run's rows, merged into the table of "
            "`python benchmarks/bench_parallel.py --size full --fresh"
        )
    notes = [
        f"{cfg['chains']} chains, float64, CPU; b2max < {THRESHOLD} on the "
        "instantaneous ensemble; 'first' / 'settled' / 'run' in sequential gradient "
        f"evaluations per chain, warm-up included; budget {cfg['budget']} per chain.",
        "'<=': ours, already below at the warm-up's end (whose trajectory is not "
        "observed): an upper bound. 'never': not within the run. 'settled' counts "
        "only if b2max then stays below for at least the last quarter of the run "
        "(settled_raw in the JSON: any tail). held: how long b2max stays below "
        "after its first crossing, as a multiple of it (the first point back above "
        f"0.01, or the run's end, over the first crossing; >= {HELD_X:g}x is issue "
        "29's 'staying there over 4x more steps'; '~': from the JSON's 200-point "
        "thinned trajectory, for rows measured before this column, an upper "
        "bound). below_after_first: the fraction of recorded points below 0.01 from "
        "the first crossing on.",
        "total_grads: all chains (ours: + L-BFGS; Hessian-vector products of the "
        "warm-up's curvature estimates listed apart in the JSON).",
        "Noise floor (b2max of N exact / reference-resampled draws: median, p95, "
        "fraction < 0.01): "
        + "; ".join(
            f"{k} {v['floor']['median']:.3g}, {v['floor']['p95']:.3g}, "
            f"{v['floor']['fraction_below']:.2f}"
            for k, v in targets_info.items()
        ),
        "Reference E[x^2], Var[x^2]: exact for gaussian100 and banana; long "
        "BlackJAX NUTS (dense metric) for logreg25, kidiq, eight_schools "
        "(unconstrained coordinates).",
        "NUTS: window adaptation on one chain, then vmapped NUTS on all chains with "
        "its step size and metric. LAPS draws its own Uniform(-2, 2) starts.",
        f"Targets done: {', '.join(done)}.",
    ]
    payload = dict(
        size=args.size,
        config=cfg,
        threshold=THRESHOLD,
        versions=dict(
            blackjax=blackjax.__version__,
            optax=optax.__version__,
            cenlmc_jax=getattr(cj, "__version__", None),
        ),
        targets=targets_info,
        targets_done=done,
    )
    write_results(
        "parallel",
        payload,
        rows,
        columns=COLUMNS,
        out_dir=args.out_dir,
        title="Many chains: steps to b2max < 0.01 (issue 29 item 3)",
        notes=notes,
        md_rows=[md_row(r) for r in rows],
        command=command,
    )


def main():
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--note", default="", help="the note column of this run's rows")
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the starts and the methods' keys (0: the table's run; another "
        "seed measures how much a first crossing varies: write it to its own "
        "--out-dir)",
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="write this run's rows alone (default: merged into parallel.json)",
    )
    args = parser.parse_args()
    if args.quick:
        args.size = "small"
    cfg = dict(SIZES[args.size])
    rows, targets_info, done = [], {}, []
    t_all = time.perf_counter()
    for name in args.targets.split(","):
        t = TARGETS[name]()
        print(f"== {name} (d = {t['d']})", flush=True)
        if t["reference"] == "nuts":
            t["ex2"], t["varx2"], t["draws"], ref = nuts_reference(t, cfg)
            print(f"   reference: {ref}", flush=True)
        else:
            ref = dict(kind="exact")
        floor = noise_floor(t, cfg["chains"])
        targets_info[name] = dict(
            d=t["d"],
            reference=ref,
            floor=floor,
            ex2=t["ex2"],
            varx2=t["varx2"],
        )
        x0 = initial_positions(cfg["chains"], t["d"], args.seed)
        for i, method in enumerate(args.methods.split(",")):
            key = jax.random.key(100 + i)
            if args.seed:
                key = jax.random.fold_in(key, args.seed)
            try:
                r = run_method(method, t, x0, key, cfg)
            except Exception as e:  # record and go on: one failure is a result too
                traceback.print_exc()
                r = dict(note=f"failed: {type(e).__name__}: {str(e)[:200]}")
            r = dict(target=name, method=method, **r)
            if args.note and "note" not in r:
                r["note"] = args.note
            rows.append(r)
            short = {k: v for k, v in r.items() if k != "trajectory"}
            print(f"   {method}: {short}", flush=True)
        done.append(name)
        write(rows, targets_info, args, cfg, done)
    print(f"total {time.perf_counter() - t_all:.0f} s", flush=True)


if __name__ == "__main__":
    main()
