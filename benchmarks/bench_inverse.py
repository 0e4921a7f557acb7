"""Wall time and model solves to equal accuracy on real inverse problems: CEnLMC, LMC
and the peers.

Problems (``cenlmc_jax.models.inverse_problems``, sampled in whitened coordinates ``z``,
references by quadrature):

* SIR epidemic, d = 2, RK4 with ``--sir-rk4-steps`` (1,000) steps in ``lax.scan``,
  autodiff gradient;
* the same SIR model as a NumPy black box behind ``jax.pure_callback``
  (``--black-box-rk4-steps``, 200), central finite-difference gradient (4 values);
* 1-D Darcy flow with 3 zone conductivities, d = 3, one tridiagonal solve per
  value, autodiff gradient and (``darcy-fd``) central finite differences (6 values).

Samplers, all started from the overdispersed Laplace approximation
``z ~ N(0, 2² I)`` (the same draws for every member count):

* ``LMC`` and ``CEnLMC`` on N particles, each with two gradients: autodiff in reverse
  mode (``grad_mode="reverse"``, ``jax.grad``) and in forward mode
  (``grad_mode="forward"``, what ``"auto"`` takes at d <= 5: the fastest at these d,
  benchmarks/results/grad_mode.md); a black box (or ``darcy-fd``) with central (2d
  values) and forward (d values) finite differences beside the value at the point. Step
  ``h = 0.05`` (CEnLMC's η, R1, R2, N*, M_f from ``suggest_cenlmc_params(d, h,
  num_particles=N)``, f* known, the default gradient audit on: its 8 gradients a step
  are counted with the others, and its variance-inflation estimate and bias flag are
  reported), for each N of ``--particles``; CEnLMC once per ensemble estimator of
  ``--estimators`` (``paper``, eq. 3.19, and ``least_squares``, a local fit beyond the
  paper whose bias the audit does not see: ``cj.cenlmc`` warns, and the warning is
  printed and kept in the results);
* gradient-based peer: BlackJAX MALA (16 chains, ε = 0.8 d^(-1/3)), with the
  autodiff gradient, or the finite-difference one through a ``custom_vjp``;
* gradient-free peers: BlackJAX random-walk MH (16 chains, σ = 2.38/sqrt(d)), emcee's
  stretch move (32 walkers, ``vectorize=True``: one model call per half-ensemble),
  NumPyro's AIES (32 walkers, DE move, a jitted ``lax.scan``; it evaluates the current
  walkers again at every step: 2 values per walker-step, as the black box's own count
  confirms).

**Accuracy to tolerance.** After ``T`` steps the estimate of the posterior
mean and sd uses the draws of steps ``(T/2, T]`` of every member (the first
half is burn-in). Errors against the reference: ``|mean_k - m_k| / s_k`` and
``|sd_k / s_k - 1|``. Steps to tolerance ``T*``: the first checkpoint (every
two chunks) from which both errors stay ``<= --tol`` (0.05) for every
coordinate at every later checkpoint, confirmed until ``2 T*`` (the windows
``(T*/2, T*]`` and ``(T*, 2T*]`` do not overlap), with ``2 MCSE <= tol`` at
every such checkpoint (an estimate inside the tolerance by luck does not
count). The MCSE of the estimates
comes from the members' window averages taken as independent (exact for
LMC, MALA and RMH chains; approximate for CEnLMC's weakly coupled particles
and for the walkers of emcee and AIES).

**Cost to tolerance.** Model solves (value units): a value is 1; a finite-difference
gradient ``2d`` (counted by ``grad_fn.model_solves``); an autodiff gradient costs ``c``
values, ``c`` the measured time ratio of the vmapped gradient and the vmapped value at N
= 2,000 (``grad_cost`` in the JSON). Wall and process CPU time to ``T*``: ``--repeats``
runs of exactly ``T*`` steps from the same state and keys, taken round-robin over the
samplers of a problem (so the ratios compare neighbours in time), compilation excluded;
medians, and the ratio to LMC at the same N per repeat (median [min, max]). The
solve-saving cap of a CEnLMC row: the saving against the best LMC at equal steps that
its measured ensemble fraction allows (``solve_cap``; the formula in the results'
notes).

One thread: the script sets ``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false
intra_op_parallelism_threads=1`` and pins itself to one CPU (``--cpu``)
unless ``--all-threads``. Run: ``python benchmarks/bench_inverse.py``
(``--quick``: small sizes, a smoke run).
"""

from __future__ import annotations

import os
import sys

if "--all-threads" not in sys.argv:  # before JAX starts: one thread, one CPU
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "")
        + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    ).strip()

import math  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import blackjax  # noqa: E402

try:  # a peer only (not with --no-peers)
    import emcee  # noqa: E402
except ImportError:
    emcee = None
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import base_parser, pin_to_one_cpu, write_results  # noqa: E402
from numpyro.infer.ensemble import AIES  # noqa: E402

import cenlmc_jax as cj  # noqa: E402
from cenlmc_jax.ensemble.cenlmc import no_lookahead  # noqa: E402
from cenlmc_jax.gradients import modes as grad_modes  # noqa: E402
from cenlmc_jax.gradients.finite_difference import finite_difference  # noqa: E402

#: CEnLMC's ensemble estimators (``cj.cenlmc(..., estimator=...)``) and the sampler
#: label of each
ESTIMATOR_LABELS = {
    "paper": "CEnLMC",
    "least_squares": "CEnLMC (LS)",
    "least_squares_quadratic": "CEnLMC (LSQ)",
    "least_squares_wide": "CEnLMC (LS wide)",
}
#: ``least_squares_wide``: the fit at the suggested η with only its own tests refusing
#: (R1 = 10, R2 = 100, N* = 1, M_f = inf, as bench_frontier's least-squares rows:
#: fraction 0.95 on SIR at a 1.4% variance error)
LS_WIDE = dict(r1=10.0, r2=100.0, n_star=1, m_f=math.inf)

#: (case, gradient label, estimator) -> why the variant is not run (``--no-skip`` runs
#: them)
_DARCY_FORWARD_HANG = (
    "it hangs: an intermittent deadlock of XLA:CPU (jax 0.10.2) executing forward-mode "
    "CEnLMC on the Darcy model (the README's Known problems). In diagnostic runs of 40 "
    "steps (N = 2000, once 500; one XLA thread, once the default threads), 3 of 8 "
    "forward-mode CEnLMC runs stopped (paper estimator 1 of 6, least_squares 2 of 2): "
    "CPU time stops growing and the main thread waits in the device-to-host copy of a "
    "chunk's result (cenlmc_jax/run.py _flag_steps), twice in the first call and once "
    "after two good chunks; reverse-mode CEnLMC, forward-mode LMC and "
    "finite-difference CEnLMC on the same model ran. A run to tolerance and its timed "
    "reruns take tens of 10-step chunks, so the variant would almost surely hang the "
    "benchmark."
)
SKIP = {
    ("darcy", "forward AD", est): _DARCY_FORWARD_HANG
    for est in ("paper", "least_squares")
}

# LMC / CEnLMC step size in whitened coordinates (ULA's sd bias on a unit Gaussian: 1.3
# %)
H = 0.05
INIT_SD = 2.0  # overdispersed start around the MAP
#: black box cases: :func:`black_box_step_costs` at the largest N, by case
COSTS = {}


# ------------------------------------------------------------------ runners


class Runner:
    """One sampler on one problem: ``advance(k)`` runs k steps and returns the draws and
    the costs.

    ``members``: particles, chains or walkers. ``advance`` returns ``(draws (k, members,
    d) float64, values, gradients)`` for those k steps (``values``: model evaluations;
    ``gradients``: gradient evaluations done). ``reset()`` goes back to the initial
    state and key, so a rerun repeats the same work.
    """

    chunk = 10

    def reset(self):
        raise NotImplementedError

    def advance(self, k):
        raise NotImplementedError


class DriverRunner(Runner):
    """A cenlmc_jax sampler object through ``cj.sample`` (LMC, CEnLMC), one call per
    chunk."""

    def __init__(self, algo, x0, key, *, grad_cost_values, has_fd):
        self.algo, self.x0, self.key = algo, x0, key
        self.members = x0.shape[0]
        self.has_fd = has_fd
        self.state0 = algo.init(x0)
        self.reset()
        cj.sample(
            jax.random.key(999), algo, self.state0, self.chunk, check_convergence=False
        )  # compile

    def reset(self):
        self.state, self.t = self.state0, 0
        self.inflation, self.drift, self.biased = (
            [],
            [],
            False,
        )  # CEnLMC's gradient audit, per step

    def advance(self, k):
        res = cj.sample(
            jax.random.fold_in(self.key, self.t),
            self.algo,
            self.state,
            k,
            check_convergence=False,
        )
        trace = np.asarray(jax.block_until_ready(res.trace), np.float64)
        self.state, self.t = res.state, self.t + 1
        info = res.info
        grads = float(
            np.sum(
                info.grad_evals_padded
                if hasattr(info, "grad_evals_padded")
                else info.grad_evals
            )
        )
        if hasattr(info, "audit_grad_evals"):
            if not hasattr(info, "grad_evals_padded"):
                # the default audit's gradients are part of the cost; CEnLMC's padded
                # count holds them already (they ride in its one gradient call), and
                # adding them again counted 8 gradients a step twice (issue 30)
                grads += float(np.sum(info.audit_grad_evals))
            self.inflation += np.asarray(
                info.audit_variance_inflation, np.float64
            ).tolist()
            if hasattr(
                info, "audit_drift_bias"
            ):  # the audit's systematic error along the gradient
                self.drift += np.asarray(info.audit_drift_bias, np.float64).tolist()
            self.biased = self.biased or bool(np.any(info.biased))
        values = (
            float(np.sum(info.f_evals))
            if hasattr(info, "f_evals")
            else (self.members * k if self.has_fd else 0.0)
        )
        return trace, values, grads


class BlackJAXRunner(Runner):
    """A BlackJAX single-chain kernel vmapped over chains, one jitted ``lax.scan`` per
    chunk."""

    def __init__(self, algo, x0, key, *, values_per_step, grads_per_step, chunk):
        self.key, self.members, self.chunk = key, x0.shape[0], chunk
        self.values_per_step, self.grads_per_step = values_per_step, grads_per_step
        self.state0 = jax.vmap(algo.init)(x0)
        step = jax.vmap(algo.step)

        def run(key, state):
            def one(state, t):
                state, info = step(
                    jax.random.split(jax.random.fold_in(key, t), self.members), state
                )
                return state, (state.position, info.acceptance_rate)

            return jax.lax.scan(one, state, jnp.arange(chunk))

        self.run = jax.jit(run)
        jax.block_until_ready(self.run(jax.random.key(999), self.state0))
        self.reset()

    def reset(self):
        self.state, self.t, self.acc = self.state0, 0, []

    def advance(self, k):
        assert k == self.chunk
        self.state, (pos, acc) = self.run(
            jax.random.fold_in(self.key, self.t), self.state
        )
        self.t += 1
        self.acc.append(float(np.mean(acc)))
        return (
            np.asarray(pos, np.float64),
            self.values_per_step * k * self.members,
            self.grads_per_step * k * self.members,
        )


class AIESRunner(Runner):
    """NumPyro's AIES kernel (DE move) on ``members`` walkers, one jitted ``lax.scan``
    per chunk."""

    def __init__(self, logdensity_fn, x0, key, *, chunk):
        self.key, self.members, self.chunk = key, x0.shape[0], chunk
        kernel = AIES(
            potential_fn=lambda z: -logdensity_fn(z), moves={AIES.DEMove(): 1.0}
        )
        self.state0 = kernel.init(
            jax.random.key_data(jax.random.split(key, self.members)), 0, x0
        )  # legacy keys, one a walker

        def run(state):
            def one(state, _):
                state = kernel.sample(state, (), {})
                return state, state.z

            return jax.lax.scan(one, state, None, length=chunk)

        self.run = jax.jit(run)
        jax.block_until_ready(self.run(self.state0))
        self.reset()

    def reset(self):
        self.state = self.state0

    def advance(self, k):
        assert k == self.chunk
        self.state, z = self.run(self.state)
        return (
            np.asarray(z, np.float64),
            2 * k * self.members,
            0.0,
        )  # it re-evaluates the current walkers


class EmceeRunner(Runner):
    """emcee's stretch move, ``vectorize=True``: ``log_prob`` gets a (walkers/2, d)
    batch per call."""

    def __init__(self, log_prob_batch, x0, seed, *, chunk):
        self.x0, self.members, self.chunk, self.seed = (
            np.asarray(x0, np.float64),
            x0.shape[0],
            chunk,
            seed,
        )
        self.log_prob_batch = log_prob_batch
        self.reset()

    def reset(self):
        self.sampler = emcee.EnsembleSampler(
            self.members, self.x0.shape[1], self.log_prob_batch, vectorize=True
        )
        self.state = emcee.State(
            self.x0, random_state=np.random.RandomState(self.seed).get_state()
        )

    def advance(self, k):
        assert k == self.chunk
        n0 = self.sampler.iteration
        self.state = self.sampler.run_mcmc(self.state, k, progress=False)
        draws = self.sampler.get_chain()[n0:]
        return np.asarray(draws, np.float64), k * self.members, 0.0


# ---------------------------------------------------------- accuracy tracking


def window_estimates(s1, s2, n_steps, ref_mean, ref_sd):
    """Estimates over the members' window sums: (err_mean (d,), err_sd (d,), mcse_mean,
    mcse_sd).

    All in units of the reference sd."""
    m = s1 / n_steps  # (members, d)
    q = s2 / n_steps
    mean = m.mean(axis=0)
    var = q.mean(axis=0) - mean**2
    sd = np.sqrt(np.maximum(var, 0.0))
    k = m.shape[0]
    se_mean = m.std(axis=0, ddof=1) / math.sqrt(k)
    se_var = (q - 2 * mean * m).std(axis=0, ddof=1) / math.sqrt(k)
    se_sd = se_var / (2 * np.maximum(sd, 1e-12))
    return (
        (mean - ref_mean) / ref_sd,
        sd / ref_sd - 1.0,
        se_mean / ref_sd,
        se_sd / ref_sd,
        mean,
        sd,
    )


def run_to_tolerance(runner, ref_mean, ref_sd, tol, max_steps, count_fn=lambda: None):
    """Chunks until the errors have stayed <= tol from T* to 2 T*; returns the record
    (module docstring)."""
    runner.reset()
    chunk = runner.chunk
    s1, s2, values, grads, walls, cpus = [], [], [0.0], [0.0], [0.0], [0.0]
    first_ok, result = None, None
    t = 0
    while t < max_steps:
        c0, w0 = time.process_time(), time.perf_counter()
        draws, v, g = runner.advance(chunk)
        walls.append(walls[-1] + time.perf_counter() - w0)
        cpus.append(cpus[-1] + time.process_time() - c0)
        values.append(values[-1] + v)
        grads.append(grads[-1] + g)
        s1.append(draws.sum(axis=0))
        s2.append((draws**2).sum(axis=0))
        t += chunk
        j = len(s1)
        if j % 2:
            continue
        em, es, sem, ses, mean, sd = window_estimates(
            sum(s1[j // 2 :]), sum(s2[j // 2 :]), t - t // 2, ref_mean, ref_sd
        )
        # within tol, and resolved: 2 MCSE <= tol, so that an estimate inside tol is not
        # there by luck
        ok = bool(
            np.all(np.abs(em) <= tol)
            and np.all(np.abs(es) <= tol)
            and np.all(2 * sem <= tol)
            and np.all(2 * ses <= tol)
        )
        here = dict(
            steps=t,
            err_mean=float(np.max(np.abs(em))),
            err_sd=float(np.max(np.abs(es))),
            mcse_mean=float(np.max(sem)),
            mcse_sd=float(np.max(ses)),
            mean=mean,
            sd=sd,
            values=values[-1],
            grads=grads[-1],
            wall_s=walls[-1],
            cpu_s=cpus[-1],
            counted_points=count_fn(),
        )
        if not ok:
            first_ok, result = None, None
        elif first_ok is None:
            first_ok, result = t, here
        if first_ok is not None and t >= 2 * first_ok:
            return dict(reached=True, **result, confirmed_to=t)
    last = here
    return dict(reached=False, **last, confirmed_to=None)


def time_runs(runners, steps, repeats):
    """Round-robin timed reruns of exactly ``steps[name]`` steps: {name: ([wall],
    [cpu])}."""
    out = {name: ([], []) for name in runners}
    for _ in range(repeats):
        for name, runner in runners.items():
            runner.reset()
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(steps[name] // runner.chunk):
                runner.advance(runner.chunk)
            out[name][0].append(time.perf_counter() - w0)
            out[name][1].append(time.process_time() - c0)
    return out


# ------------------------------------------------------------------- costs


#: CEnLMC runners' samplers with ``lookahead=False`` (two model calls a step), by
#: runner name: black_box_step_costs times a step of each beside the default's
TWO_CALLS = {}


def black_box_step_costs(problem, runners, n, repeats=15):
    """Where a forward-FD step's CPU time goes on the black box at ``n`` particles.

    Median process CPU ms of ``repeats`` interleaved calls, after the timed runs, at
    the final state of ``CEnLMC forward FD N=n``: the NumPy model alone on 1 point
    (its cost per call), on ``n`` points (CEnLMC's value call) and on ``n (d + 1)``
    (LMC's one call a step: the gradient's points and the value); CEnLMC's pair
    force (``cj.pairwise.ensemble_force``, the step's arguments); and one jitted
    step of each sampler from that state (LMC from its positions), CEnLMC with
    and without its lookahead (one model call a step: the N values and the next
    step's gradients, ``N + (bucket) d`` points, ``info.grad_evals_padded``, the
    audit's candidates included; without it two: ``(bucket) d`` points, then N),
    and the lookahead's count pass (the R2-neighbours among the new w). The same
    chain either way. None when the run is missing."""
    key = f"CEnLMC forward FD N={n}"
    if key not in runners or f"LMC forward FD N={n}" not in runners:
        return None
    cen, lmc = runners[key][0], runners[f"LMC forward FD N={n}"][0]
    params = runners[key][1]["params"]
    state = cen.state
    d = problem.dim
    model = problem.data["logposterior_numpy"]
    theta = np.asarray(problem.to_params(np.asarray(state.position, np.float64)))
    rows = np.concatenate([theta] * (d + 1))
    step_key = jax.random.key(12345)
    cen_step, lmc_step = jax.jit(cen.algo.step), jax.jit(lmc.algo.step)
    lmc_state = lmc.algo.init(state.position)
    dt = state.position.dtype
    pair = jax.jit(
        lambda s: cj.pairwise.ensemble_force(
            s.position,
            -s.logdensity,
            s.log_p,
            jnp.asarray(params["eta"], dt),
            w=s.w,
            r2=jnp.asarray(params["r2"], dt),
            return_fallback=True,
        )
    )
    padded = int(cen_step(step_key, state)[1].grad_evals_padded)
    # the same sampler with two model calls a step (EnsembleOptions(lookahead=False))
    two_step = jax.jit(TWO_CALLS[key].step)
    two_state = state._replace(lookahead=no_lookahead(state.position))
    def count_pass(s):
        # only the counts and the flag leave the program, as in the step, where XLA
        # then drops the force product (returning the whole force would time work
        # the step does not do)
        out, fallback = cj.pairwise.ensemble_force(
            s.w,
            jnp.zeros_like(s.logdensity),
            jnp.zeros_like(s.logdensity),
            jnp.asarray(params["r2"], dt),
            return_fallback=True,
        )
        return out.n_ball, fallback

    count = jax.jit(count_pass)
    calls = {
        "model, 1 point": lambda: model(theta[:1]),
        f"model, N = {n} points (CEnLMC's values without the lookahead)": lambda: model(
            theta
        ),
        f"model, {padded * d} points (its gradient call without it)": lambda: model(
            rows[: padded * d]
        ),
        f"model, N + {padded * d} points (CEnLMC's one call)": lambda: model(
            rows[: n + padded * d]
        ),
        f"model, N (d + 1) = {n * (d + 1)} points (LMC's call)": lambda: model(rows),
        "CEnLMC pair force": lambda: jax.block_until_ready(pair(state)),
        "the lookahead's count pass": lambda: jax.block_until_ready(count(state)),
        "CEnLMC step": lambda: jax.block_until_ready(cen_step(step_key, state)),
        "CEnLMC step, lookahead off (two calls)": lambda: jax.block_until_ready(
            two_step(step_key, two_state)
        ),
        "LMC step": lambda: jax.block_until_ready(lmc_step(step_key, lmc_state)),
    }
    times = {k: [] for k in calls}
    for fn in calls.values():
        fn()  # compile, warm up
    for _ in range(repeats):
        for k, fn in calls.items():
            c0 = time.process_time()
            fn()
            times[k].append(1e3 * (time.process_time() - c0))
    return dict(
        N=n,
        repeats=repeats,
        grad_evals_padded=padded,
        cpu_ms={k: statistics.median(v) for k, v in times.items()},
    )


def autodiff_grad_cost(logdensity_fn, d, n=2000, repeats=5, grad_mode="reverse"):
    """Measured time of the vmapped gradient (in ``grad_mode``) over the vmapped value
    at n points (in values)."""
    x = jax.random.normal(jax.random.key(5), (n, d))
    val = jax.jit(jax.vmap(logdensity_fn))
    grad = jax.jit(jax.vmap(grad_modes.grad(logdensity_fn, grad_mode)))

    def med(fn):
        jax.block_until_ready(fn(x))
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(x))
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    return med(grad) / med(val)


def fd_logdensity(logdensity_fn, grad_fn):
    """``logdensity_fn`` whose JAX gradient is ``grad_fn`` (finite differences): for
    BlackJAX MALA on a black box."""

    @jax.custom_vjp
    def f(z):
        return logdensity_fn(z)

    def fwd(z):
        return logdensity_fn(z), z

    def bwd(z, g):
        return (g * grad_fn(z),)

    f.defvjp(fwd, bwd)
    return f


# ------------------------------------------------------------------- cases


def gradient_variants(problem, kind, grad_costs):
    """The gradients LMC and CEnLMC are run with: {label: (sampler keywords, cost of one
    gradient in values)}.

    Autodiff: reverse mode (``jax.grad``, the library's default before grad_mode) and
    forward mode (the fastest at d <= 5, ``grad_mode="auto"``'s choice). Black box /
    finite difference: central and forward differences (``cj.finite_difference``), at 2d
    and d values a gradient beside the value at the point, which CEnLMC has at every
    particle for its ensemble and forward-FD LMC evaluates in the gradient's batch;
    central-FD LMC evaluates no value (:func:`value_beside`; the black box's own count
    of points confirms both, ``counted_points``)."""
    d = problem.dim
    if kind == "autodiff":
        return {
            f"{m} AD": (dict(grad_mode=m), grad_costs[m])
            for m in ("reverse", "forward")
        }
    return {
        f"{scheme} FD": (
            dict(grad_fn=finite_difference(problem.logdensity_fn, scheme=scheme)),
            2 * d if scheme == "central" else d,
        )
        for scheme in ("central", "forward")
    }


def value_beside(kw, d):
    """Whether LMC with the sampler keywords ``kw`` evaluates the value at the point
    beside its finite-difference gradient: forward differences (``d + 1`` points a
    gradient), not central ones (``2d`` points, no value) nor autodiff."""
    g = kw.get("grad_fn")
    return g is not None and g.model_solves(d) > g.model_solves_given_value(d)


def build_runners(
    case,
    problem,
    kind,
    particles,
    peers,
    seed,
    quick,
    grad_costs,
    estimators,
    skipped,
    caveats,
):
    """Every sampler of one (problem, gradient kind) case: {name: (runner, info)}.

    CEnLMC runs once per estimator of ``estimators``; a variant in :data:`SKIP` is not
    built (its reason is printed and appended to ``skipped``); the warnings
    ``cj.cenlmc`` gives are printed
    and kept in ``caveats`` ({message: [runner names]})."""
    d = problem.dim
    key = jax.random.key(seed)
    grad_fn = (
        problem.grad_fn
        if kind == "black box"
        else (
            finite_difference(problem.logdensity_fn)
            if kind == "finite difference"
            else None
        )
    )
    fd = grad_fn is not None
    runners = {}
    for n in particles:
        x0 = INIT_SD * jax.random.normal(jax.random.fold_in(key, n), (n, d))
        s = cj.ensemble.tuning.suggest_cenlmc_params(d, H, num_particles=n)
        params = dict(
            eta=round(s.eta, 3),
            r1=round(s.r1, 3),
            r2=round(s.r2, 3),
            n_star=s.n_star,
            m_f=round(s.m_f, 2),
        )
        for label, (kw, cost) in gradient_variants(problem, kind, grad_costs).items():
            lmc = cj.lmc(problem.logdensity_fn, H, **kw)
            runners[f"LMC {label} N={n}"] = (
                DriverRunner(
                    lmc, x0, key, grad_cost_values=None, has_fd=value_beside(kw, d)
                ),
                dict(sampler="LMC", N=n, variant=label, grad_cost=cost),
            )
            for est in estimators:
                sampler = ESTIMATOR_LABELS[est]
                name = f"{sampler} {label} N={n}"
                why = SKIP.get((case, label, est))
                if why is not None:
                    print(f"   SKIPPED {name}: {why}", flush=True)
                    skipped.append(f"{case}: {name}: {why}")
                    continue
                with warnings.catch_warnings(
                    record=True
                ) as caught:  # recorded and printed, not hidden
                    warnings.simplefilter("always")
                    if est == "least_squares_wide":
                        cen = cj.cenlmc(
                            problem.logdensity_fn,
                            H,
                            s.eta,
                            LS_WIDE["r1"],
                            LS_WIDE["r2"],
                            LS_WIDE["n_star"],
                            LS_WIDE["m_f"],
                            f_star=problem.f_star,
                            estimator="least_squares",
                            **kw,
                        )
                    else:
                        args = (problem.logdensity_fn, H, s.eta, s.r1, s.r2, s.n_star)
                        kwargs = dict(f_star=problem.f_star, estimator=est, **kw)
                        cen = cj.cenlmc(*args, s.m_f, **kwargs)
                        if "grad_fn" in kw:  # its step costs without the lookahead
                            TWO_CALLS[name] = cj.cenlmc(
                                *args, s.m_f, **kwargs, lookahead=False
                            )
                for w in caught:
                    msg = f"{w.category.__name__}: {w.message}"
                    if msg not in caveats:
                        print(
                            f"   cj.cenlmc(estimator={est!r}) warns: {msg}", flush=True
                        )
                    caveats.setdefault(msg, []).append(f"{case}: {name}")
                runners[name] = (
                    DriverRunner(cen, x0, key, grad_cost_values=None, has_fd=fd),
                    dict(
                        sampler=sampler,
                        N=n,
                        params=params,
                        variant=label,
                        grad_cost=cost,
                        estimator=est,
                        warnings=[
                            f"{w.category.__name__}: {w.message}" for w in caught
                        ],
                    ),
                )
    if peers is None:
        return runners
    chains, walkers = peers
    xc = INIT_SD * jax.random.normal(jax.random.fold_in(key, 1), (chains, d))
    xw = INIT_SD * jax.random.normal(jax.random.fold_in(key, 2), (walkers, d))
    logd_mala = (
        fd_logdensity(problem.logdensity_fn, grad_fn) if fd else problem.logdensity_fn
    )
    eps = 0.8 * d ** (-1 / 3)
    mala_chunk = 20 if quick else 50
    runners[f"MALA (BlackJAX) C={chains}"] = (
        BlackJAXRunner(
            blackjax.mala(logd_mala, eps),
            xc,
            key,
            values_per_step=1.0 if fd else 0.0,
            grads_per_step=1.0,
            chunk=mala_chunk,
        ),
        dict(sampler="MALA (BlackJAX)", N=chains, params=dict(step_size=round(eps, 3))),
    )
    sigma = 2.38 / math.sqrt(d)
    runners[f"RMH (BlackJAX) C={chains}"] = (
        BlackJAXRunner(
            blackjax.additive_step_random_walk.normal_random_walk(
                problem.logdensity_fn, sigma
            ),
            xc,
            key,
            values_per_step=1.0,
            grads_per_step=0.0,
            chunk=2 * mala_chunk,
        ),
        dict(sampler="RMH (BlackJAX)", N=chains, params=dict(sigma=round(sigma, 3))),
    )
    if kind == "black box":
        logpost_numpy, theta_map, chol = (
            problem.data["logposterior_numpy"],
            problem.theta_map,
            problem.whitening,
        )

        def log_prob_batch(z):  # emcee calls the NumPy model itself: no JAX in the loop
            return logpost_numpy(theta_map + np.asarray(z) @ chol.T)
    else:
        batched = jax.jit(jax.vmap(problem.logdensity_fn))

        def log_prob_batch(z):
            return np.asarray(batched(jnp.asarray(z, jnp.float32)), np.float64)

    runners[f"emcee W={walkers}"] = (
        EmceeRunner(log_prob_batch, xw, seed, chunk=2 * mala_chunk),
        dict(sampler="emcee (stretch)", N=walkers),
    )
    runners[f"AIES (NumPyro) W={walkers}"] = (
        AIESRunner(problem.logdensity_fn, xw, key, chunk=2 * mala_chunk),
        dict(sampler="AIES (NumPyro)", N=walkers),
    )
    return runners


def max_steps_for(info, quick):
    if info["sampler"] == "LMC" or info["sampler"].startswith("CEnLMC"):
        return 300 if quick else 800
    if info["sampler"].startswith("MALA"):
        return 2000 if quick else 6000
    return 4000 if quick else 12000


def run_case(
    label,
    problem,
    kind,
    particles,
    peers,
    tol,
    repeats,
    seed,
    quick,
    grad_costs,
    estimators,
    skipped,
    caveats,
):
    print(f"== {label} ({kind}), d={problem.dim}", flush=True)
    ref_mean, ref_sd = np.asarray(problem.mean), np.sqrt(np.diag(problem.cov))
    runners = build_runners(
        label,
        problem,
        kind,
        particles,
        peers,
        seed,
        quick,
        grad_costs,
        estimators,
        skipped,
        caveats,
    )
    records = {}
    counter = problem.data.get(
        "counter"
    )  # the black box counts the points it evaluated
    for name, (runner, info) in runners.items():
        if counter is not None:
            counter.reset()
        rec = run_to_tolerance(
            runner,
            ref_mean,
            ref_sd,
            tol,
            max_steps_for(info, quick),
            count_fn=(lambda: None) if counter is None else (lambda: counter.points),
        )
        records[name] = rec
        print(
            f"   {name}: reached={rec['reached']} steps={rec['steps']} "
            f"err_mean={rec['err_mean']:.3f} err_sd={rec['err_sd']:.3f} "
            f"grads={rec['grads']:.3g} wall={rec['wall_s']:.2f}s",
            flush=True,
        )
    timed = time_runs(
        {n: r for n, (r, _) in runners.items()},
        {n: records[n]["steps"] for n in runners},
        repeats,
    )
    if kind == "black box":
        COSTS[label] = black_box_step_costs(problem, runners, max(particles))
    d = problem.dim
    rows = []
    for name, (runner, info) in runners.items():
        rec = records[name]
        walls, cpus = timed[name]
        n = info["N"]
        # model solves in value units
        grads, values = rec["grads"], rec["values"]
        per_grad = info.get(
            "grad_cost", grad_costs.get("reverse", 2 * d)
        )  # peers: the case's own gradient
        solves = values + grads * per_grad
        variant = info.get(
            "variant",
            {
                "autodiff": "reverse AD",
                "black box": "central FD",
                "finite difference": "central FD",
            }[kind],
        )
        row = dict(
            problem=label,
            d=d,
            gradient=variant,
            sampler=info["sampler"],
            N=n,
            reached=rec["reached"],
            steps_to_tol=rec["steps"],
            confirmed_to=rec["confirmed_to"],
            values=values,
            gradients=grads,
            model_solves=solves,
            wall_s=statistics.median(walls),
            cpu_s=statistics.median(cpus),
            walls=walls,
            cpus=cpus,
            err_mean=rec["err_mean"],
            mcse_mean=rec["mcse_mean"],
            err_sd=rec["err_sd"],
            mcse_sd=rec["mcse_sd"],
            mean=rec["mean"],
            sd=rec["sd"],
            params=info.get("params"),
            counted_points=rec["counted_points"],
            grad_fraction=grads / (n * rec["steps"]),
            grad_cost=per_grad,
            estimator=info.get("estimator"),
            warnings=info.get("warnings"),
        )
        if isinstance(runner, BlackJAXRunner):
            row["acceptance"] = float(np.mean(runner.acc)) if runner.acc else None
        if getattr(
            runner, "inflation", None
        ):  # CEnLMC: the audit over the timed run's window (T/2, T]
            window = runner.inflation[len(runner.inflation) // 2 :]
            row["audit_inflation"] = float(np.nanmean(window))
            row["audit_biased"] = runner.biased
            if runner.drift:
                row["audit_drift_bias"] = float(
                    np.nanmean(runner.drift[len(runner.drift) // 2 :])
                )
        rows.append(row)
    compare(rows, particles)
    return rows


def compare(rows, particles):
    """Ratios against LMC: the same gradient at the same N (``cpu_ratio``...), and the
    best LMC at the same N (``best_cpu_ratio``: the LMC row of least median CPU time to
    tolerance; peers: at the largest N)."""
    lmcs = [r for r in rows if r["sampler"] == "LMC"]
    for r in rows:
        ours = r["sampler"] == "LMC" or r["sampler"].startswith("CEnLMC")
        same_n = (
            [m for m in lmcs if m["N"] == r["N"]]
            if ours
            else [m for m in lmcs if m["N"] == max(particles)]
        )
        if not same_n:
            continue
        same = [m for m in same_n if m["gradient"] == r["gradient"]]
        best = min(same_n, key=lambda m: m["cpu_s"])
        r["vs_best"] = f"LMC {best['gradient']} N={best['N']}"
        cr = sorted(bc / c for bc, c in zip(best["cpus"], r["cpus"], strict=True))
        r["best_cpu_ratio"], r["best_cpu_ratio_range"] = (
            statistics.median(cr),
            [cr[0], cr[-1]],
        )
        r["best_solve_saving"] = best["model_solves"] / r["model_solves"]
        lmc = same[0] if same else best
        r["vs"] = f"LMC {lmc['gradient']} N={lmc['N']}"
        ratios = sorted(lw / w for lw, w in zip(lmc["walls"], r["walls"], strict=True))
        cratios = sorted(lc / c for lc, c in zip(lmc["cpus"], r["cpus"], strict=True))
        r["wall_ratio"] = statistics.median(ratios)
        r["wall_ratio_range"] = [ratios[0], ratios[-1]]
        r["cpu_ratio"] = statistics.median(cratios)
        r["cpu_ratio_range"] = [cratios[0], cratios[-1]]
        r["solve_saving"] = lmc["model_solves"] / r["model_solves"]
        r["grad_saving"] = (
            lmc["gradients"] / r["gradients"] if r["gradients"] > 0 else None
        )
        if r["sampler"].startswith("CEnLMC") and r["grad_saving"]:
            r["cpu_over_grad_saving"] = r["cpu_ratio"] / r["grad_saving"]
            r["cpu_over_solve_saving"] = r["cpu_ratio"] / r["solve_saving"]
            r.update(solve_cap(r, best))


def solve_cap(r, best):
    """The most model solves CEnLMC row ``r`` can save against LMC row ``best`` at its
    measured ensemble fraction.

    Per member-step, as the bench counts: LMC ``v_L + c_L`` (``v_L``: values per
    member-step, 1 with forward differences, where LMC evaluates the value beside the
    gradient, 0 with central ones, which need none, and with autodiff, whose value comes
    with the gradient's measured cost; ``c_L``: its gradient's cost in values),
    CEnLMC ``v + (1 - φ) c`` (``v`` = 1, a value at every particle each step;
    ``1 - φ`` its gradients per member-step, the audit's included; ``c`` its
    gradient's cost). ``cap = (v_L + c_L) / (v + (1 - φ)
    c)``: the saving at equal steps to tolerance; ``cap_phi1 = (v_L + c_L) / v``, the
    φ = 1 limit."""
    member_steps = r["N"] * r["steps_to_tol"]
    lmc_steps = best["N"] * best["steps_to_tol"]
    lmc_per_step = (best["values"] + best["gradients"] * best["grad_cost"]) / lmc_steps
    v = r["values"] / member_steps
    phi = 1.0 - r["grad_fraction"]
    return dict(
        ensemble_fraction=phi,
        solve_cap=lmc_per_step / (v + (1 - phi) * r["grad_cost"]),
        solve_cap_phi1=lmc_per_step / v,
    )


def fmt_row(r):
    def g(x, spec=".3g"):
        return "-" if x is None else format(x, spec)

    acc = (
        f"mean {r['err_mean']:.3f}±{r['mcse_mean']:.3f}, sd "
        f"{r['err_sd']:.3f}±{r['mcse_sd']:.3f}"
    )
    rr, br = r.get("cpu_ratio_range"), r.get("best_cpu_ratio_range")
    return {
        "problem": r["problem"],
        "gradient": r["gradient"],
        "sampler": r["sampler"],
        "N": r["N"],
        "steps to tol": (
            str(r["steps_to_tol"])
            if r["reached"]
            else f">{r['steps_to_tol']} (not reached)"
        ),
        "model solves": f"{r['model_solves']:.3g}",
        "gradients": f"{r['gradients']:.3g}",
        "wall s": f"{r['wall_s']:.2f}",
        "CPU s": f"{r['cpu_s']:.2f}",
        "CPU ratio vs LMC, same gradient": "-"
        if rr is None
        else f"{r['cpu_ratio']:.2f} [{rr[0]:.2f}, {rr[1]:.2f}] ({r['vs']})",
        "CPU ratio vs best LMC": "-"
        if br is None
        else f"{r['best_cpu_ratio']:.2f} [{br[0]:.2f}, {br[1]:.2f}] ({r['vs_best']})",
        "estimator": r.get("estimator") or "-",
        "solve saving": g(r.get("solve_saving"), ".2f"),
        "grad saving": g(r.get("grad_saving"), ".2f"),
        "solve saving vs best LMC": g(r.get("best_solve_saving"), ".2f"),
        "solve-saving cap (φ)": (
            "-"
            if r.get("solve_cap") is None
            else f"{r['solve_cap']:.2f} "
            f"(φ {r['ensemble_fraction']:.2f}; φ=1: {r['solve_cap_phi1']:.2f})"
        ),
        "CPU / grad saving": g(r.get("cpu_over_grad_saving"), ".2f"),
        "CPU / solve saving": g(r.get("cpu_over_solve_saving"), ".2f"),
        "grads per member-step": g(r["grad_fraction"], ".2f"),
        "audit: variance inflation (flag)": (
            "-"
            if r.get("audit_inflation") is None
            else f"{r['audit_inflation']:.3f}"
            + (" BIASED" if r["audit_biased"] else "")
        ),
        "audit: drift bias β": g(r.get("audit_drift_bias"), "+.3f"),
        "error vs ref ± MCSE": acc,
    }


def main():
    p = base_parser(" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--particles", type=int, nargs="+", default=[500, 2000, 4000])
    p.add_argument(
        "--tol",
        type=float,
        default=0.05,
        help="tolerance on |mean error|/sd and |sd/sd_ref - 1|",
    )
    p.add_argument("--sir-rk4-steps", type=int, default=1000)
    p.add_argument("--black-box-rk4-steps", type=int, default=200)
    p.add_argument(
        "--cases", nargs="+", default=["sir", "sir-black-box", "darcy", "darcy-fd"]
    )
    p.add_argument(
        "--cpu",
        type=int,
        default=None,
        help="CPU to pin to (default: the last one allowed)",
    )
    p.add_argument(
        "--all-threads",
        action="store_true",
        help="do not pin to one CPU / one XLA thread",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--no-peers",
        action="store_true",
        help="LMC and CEnLMC only (no MALA, RMH, emcee, AIES)",
    )
    p.add_argument(
        "--estimators",
        nargs="+",
        default=["paper", "least_squares"],
        choices=list(ESTIMATOR_LABELS),
        help="CEnLMC's ensemble estimators: each CEnLMC variant runs once per "
        "estimator",
    )
    p.add_argument(
        "--no-skip",
        action="store_true",
        help="run the variants of SKIP too (they hang)",
    )
    p.set_defaults(repeats=3)
    args = p.parse_args()
    if not args.all_threads:
        pin_to_one_cpu(args.cpu)
    particles = [500] if args.quick else args.particles
    peers = None if args.no_peers else (16, 32)
    repeats = 1 if args.quick else args.repeats
    sir_steps = 200 if args.quick else args.sir_rk4_steps
    bb_steps = 100 if args.quick else args.black_box_rk4_steps

    if args.no_skip:
        SKIP.clear()
    rows, costs, problems_info, skipped, caveats = [], {}, {}, [], {}
    for case in args.cases:
        if case == "sir":
            problem, kind = (
                cj.models.inverse_problems.sir_epidemic(num_rk4_steps=sir_steps),
                "autodiff",
            )
        elif case == "sir-black-box":
            problem, kind = (
                cj.models.inverse_problems.sir_epidemic_black_box(
                    num_rk4_steps=bb_steps
                ),
                "black box",
            )
        elif case == "darcy":
            problem, kind = cj.models.inverse_problems.darcy_flow(3), "autodiff"
        elif case == "darcy-fd":
            problem, kind = (
                cj.models.inverse_problems.darcy_flow(3),
                "finite difference",
            )
        else:
            raise SystemExit(f"unknown case {case!r}")
        grad_costs = (
            {
                m: autodiff_grad_cost(problem.logdensity_fn, problem.dim, grad_mode=m)
                for m in ("reverse", "forward")
            }
            if kind == "autodiff"
            else {}
        )
        costs[case] = grad_costs
        problems_info[case] = dict(
            name=problem.name,
            dim=problem.dim,
            reference=problem.reference,
            mean=problem.mean,
            sd=np.sqrt(np.diag(problem.cov)),
        )
        case_particles = particles if case in ("sir", "darcy") else particles[:2]
        rows += run_case(
            case,
            problem,
            kind,
            case_particles,
            peers,
            args.tol,
            repeats,
            args.seed,
            args.quick,
            grad_costs,
            args.estimators,
            skipped,
            caveats,
        )

    columns = [
        "problem",
        "gradient",
        "sampler",
        "estimator",
        "N",
        "steps to tol",
        "model solves",
        "gradients",
        "wall s",
        "CPU s",
        "grads per member-step",
        "CPU ratio vs LMC, same gradient",
        "CPU ratio vs best LMC",
        "solve saving",
        "solve saving vs best LMC",
        "solve-saving cap (φ)",
        "grad saving",
        "CPU / grad saving",
        "CPU / solve saving",
        "audit: variance inflation (flag)",
        "audit: drift bias β",
        "error vs ref ± MCSE",
    ]
    notes = [
        f"Tolerance {args.tol}: |mean_k - ref_k| / sd_k and |sd_k / sd_ref_k - 1| for "
        "every coordinate, estimated from steps (T/2, T] of every member, with 2 MCSE "
        "<= tolerance, holding from T* (steps to tol) to 2 T*. Error columns: the "
        "largest over coordinates at T*, ± the largest MCSE (members' window averages "
        "as independent).",
        "Model solves in value units: a value 1; a finite-difference gradient 2d "
        "(central) or d (forward) beside the value at the point, which forward-FD LMC "
        "evaluates in the gradient's batch (central-FD LMC evaluates none: its 2d "
        "points a gradient, as the black box's count confirms; before issue 30 the "
        "bench counted a value for it too) and CEnLMC has (d + 1 / 2d + 1 values a "
        "gradient before cj.finite_difference reused it, stop 24); an autodiff "
        "gradient its "
        "measured time in values (grad_cost: "
        + "; ".join(
            f"{k} " + ", ".join(f"{m} {v:.1f}" for m, v in c.items())
            for k, c in costs.items()
            if c
        )
        + ").",
        "gradient: reverse AD = jax.grad (grad_mode='reverse', the default before "
        "grad_mode existed); forward AD = grad_mode='forward' (what grad_mode='auto' "
        "now takes at d <= 5); central / forward FD = cj.finite_difference(scheme=...) "
        "(2d / d values a gradient, the value at the point beside it).",
        f"Wall/CPU s: median of {repeats} reruns of exactly T* steps, round-robin over "
        "a problem's samplers, compilation excluded, one XLA thread pinned to one CPU "
        "(process CPU time is the steadier figure on this shared machine). CPU ratio "
        "vs LMC: LMC's CPU time to tolerance over the sampler's, per repeat, median "
        "[min, max]: vs LMC with the same gradient at the same N, and vs the best LMC "
        "(least CPU time to tolerance among the LMC rows at the same N, any gradient "
        "of the case); peers vs LMC at the largest N.",
        "grad saving, solve saving: LMC's gradients / model solves to tolerance over "
        "the sampler's. CPU / grad saving (solve saving): CEnLMC's CPU ratio divided "
        "by its gradient (model-solve) saving (goal: CPU / grad saving >= 0.9). grads "
        "per member-step: gradients / (N · T*) (1 for LMC and MALA).",
        "Black box: the NumPy model's own count of points evaluated is in the JSON "
        "(counted_points) beside values + (2d or d) · gradients; emcee calls the NumPy "
        "log posterior directly (no JAX in its loop).",
        f"LMC/CEnLMC: h = {H}, start z ~ N(0, {INIT_SD}² I); CEnLMC parameters from "
        "suggest_cenlmc_params (per row in the JSON; N* from its noise budget, "
        "predicted variance inflation <= 0.02), with the default gradient audit (8 "
        "particles a step, its gradients counted in gradients and model solves). MALA "
        "16 chains ε = 0.8 d^(-1/3); RMH 16 chains σ = 2.38/sqrt(d); emcee and AIES "
        "32 walkers; same start distribution.",
        "audit: CEnLMC's mean info.audit_variance_inflation over the second half of "
        "its last run to T* (the relative variance inflation by the ensemble noise; "
        "the sd is off by about half of it), BIASED when info.biased was set (running "
        "estimate > 0.06, or |running drift bias| > 0.06). audit: drift bias β: the "
        "mean of info.audit_drift_bias over the same window (the force's systematic "
        "error along the gradient, fraction x Σ e·∇f / Σ |∇f|² over the audited "
        "particles; 0 for an unbiased force, -β a first-order guide to the relative "
        "variance error; it compares the force with the sampler's own gradient, so a "
        "bias of that gradient, e.g. forward FD's, is not in it).",
        "estimator: CEnLMC's ensemble gradient, cj.cenlmc(..., estimator=...): paper "
        "(eq. 3.19, sampler CEnLMC) or least_squares (a local least-squares fit, "
        "beyond the paper; sampler CEnLMC (LS)); both with the same "
        "suggest_cenlmc_params parameters. The variance-inflation column does not see "
        "the least-squares fit's bias (the warning below); the drift-bias column is "
        "the audit's measure of it, and the error-vs-reference column the check.",
        "solve saving vs best LMC: the best LMC's model solves to tolerance over the "
        "row's. solve-saving cap: the most CEnLMC can save against that best LMC at "
        "equal steps to tolerance, given its measured ensemble fraction φ = 1 - (grads "
        "per member-step, the audit's included), as the bench counts solves per "
        "member-step: cap = (v_L + c_L) / (1 + (1 - φ) c), where c_L is the best LMC's "
        "gradient cost in values and v_L its values per member-step (1 with forward "
        "differences: LMC evaluates the value in the gradient's batch, as the black "
        "box's own count confirms; 0 with central differences, which need no value, "
        "and with autodiff, whose value comes inside the measured grad_cost), 1 is "
        "CEnLMC's value at every particle each step and c its own gradient's cost "
        "given that value (2d central FD, d forward FD: cj.finite_difference reuses "
        "it; grad_cost for AD). Forward FD on both sides: cap = (d + 1) / (1 + "
        "(1 - φ) d), φ = 1 limit d + 1 (3x at d = 2 SIR, 4x at d = 3 Darcy). "
        "Autodiff, same mode both sides: cap = c / (1 + (1 - φ) c), limit c.",
    ]
    for case, c in COSTS.items():
        if c is not None:
            notes.append(
                f"Where a step's CPU time goes ({case}, forward FD, N = {c['N']}, at "
                "CEnLMC's last state; median ms of "
                f"{c['repeats']} interleaved calls, black_box_step_costs): "
                + "; ".join(f"{k} {v:.2f}" for k, v in c["cpu_ms"].items())
                + ". LMC makes one model call a step; CEnLMC one with its lookahead "
                "(the values and the next step's gradients of the particles that "
                "will need one, padded to a bucket; a second call only on a miss), "
                "two without it (the gradients, then the values)."
            )
    for msg, names in caveats.items():
        notes.append(f"cj.cenlmc warned ({len(names)} runs: {', '.join(names)}): {msg}")
    for line in skipped:
        notes.append(f"Not run: {line}")
    write_results(
        "inverse",
        dict(
            args=vars(args),
            grad_cost=costs,
            problems=problems_info,
            skipped=skipped,
            warnings=caveats,
            black_box_step_costs=COSTS,
        ),
        rows,
        columns=columns,
        md_rows=[fmt_row(r) for r in rows],
        out_dir=args.out_dir,
        title="Wall time and model solves to equal accuracy on inverse problems",
        notes=notes,
    )


if __name__ == "__main__":
    main()
