"""Forward against reverse mode for the gradient of a log density: where
``grad_mode="auto"`` switches.

Times ``jax.vmap(cenlmc_jax.gradients.modes.value_and_grad(logdensity_fn, mode))``
on N particles (the work of one LMC step's gradients), reverse
(``jax.value_and_grad``) and forward (d vmapped ``jvp``s, the value from the
primal), at d = 1, 2, 3, 5, 10, 20, 50, on:

* ``sir-d`` (an ODE model): the SIR epidemic of
  :mod:`cenlmc_jax.models.inverse_problems` (RK4 with 1,000 steps in ``lax.scan``, 20
  log-normal prevalence observations) with a time-varying contact rate ``log β(t) = log
  0.5 + θ_0 + 0.3 Σ_{k=1}^{d-1} θ_k cos(π k t / T)`` (piecewise constant over an RK4
  step), γ = 0.2, a N(0, 1) prior: d parameters, the state stays (S, I). At d = 2 the
  library's own ``cj.models.inverse_problems.sir_epidemic()`` (θ = (log β, log γ)) is
  timed too (``sir``).
* ``gaussian`` (closed form): ``-½ xᵀ A x`` with a dense SPD ``A`` (O(d²) a value);
* ``logistic`` (closed form): a logistic regression on 200 data points (O(200 d) a
  value).

Each configuration is compiled once; then ``--repeats`` rounds alternate
reverse and forward (each a loop of calls lasting >= 0.2 s), and the ratio
reverse / forward is taken per round (> 1: forward is faster): median [min,
max]. Process CPU time, one XLA thread pinned to one CPU (unless
``--all-threads``), float32. The machine is shared and noisy: the ratios of
neighbours in time are the figures to read, not the absolute times.

Run: ``python benchmarks/bench_grad_mode.py`` (``--quick``: a smoke run).
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

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import base_parser, pin_to_one_cpu, write_results  # noqa: E402

import cenlmc_jax as cj  # noqa: E402
from cenlmc_jax.gradients.modes import FORWARD_MAX_D, value_and_grad  # noqa: E402

DIMS = (1, 2, 3, 5, 10, 20, 50)
SIR_T, SIR_STEPS, SIR_OBS, GAMMA, NOISE_SD = 60.0, 1000, 20, 0.2, 0.25


def sir_d(d, num_steps=SIR_STEPS):
    """The SIR model with d parameters of the contact rate (module docstring); data
    simulated at θ = 0."""
    per_obs = num_steps // SIR_OBS
    dt = SIR_T / num_steps
    t = dt * np.arange(num_steps)
    waves = 0.3 * np.cos(np.pi * np.arange(1, d)[None, :] * t[:, None] / SIR_T)
    basis = np.concatenate([np.ones((num_steps, 1)), waves], axis=1).astype(
        np.float32
    )  # (steps, d)

    def prevalence(theta):
        log_beta = math.log(0.5) + jnp.asarray(basis, theta.dtype) @ theta  # (steps,)

        def rk4(y, lb):
            s, i = y
            beta = jnp.exp(lb)

            def rhs(s, i):
                inf = beta * s * i
                return -inf, inf - GAMMA * i

            a1, b1 = rhs(s, i)
            a2, b2 = rhs(s + 0.5 * dt * a1, i + 0.5 * dt * b1)
            a3, b3 = rhs(s + 0.5 * dt * a2, i + 0.5 * dt * b2)
            a4, b4 = rhs(s + dt * a3, i + dt * b3)
            return (
                s + dt / 6 * (a1 + 2 * a2 + 2 * a3 + a4),
                i + dt / 6 * (b1 + 2 * b2 + 2 * b3 + b4),
            ), None

        def observe(y, lbs):
            y, _ = jax.lax.scan(rk4, y, lbs)
            return y, y[1]

        y0 = (jnp.asarray(0.99, theta.dtype), jnp.asarray(0.01, theta.dtype))
        return jax.lax.scan(observe, y0, log_beta.reshape(SIR_OBS, per_obs))[1]

    log_y = np.log(np.asarray(prevalence(jnp.zeros(d, jnp.float32))))

    def logdensity(theta):
        r = (jnp.asarray(log_y, theta.dtype) - jnp.log(prevalence(theta))) / NOISE_SD
        return -0.5 * jnp.sum(r**2) - 0.5 * jnp.sum(theta**2)

    return logdensity


def gaussian(d):
    rng = np.random.default_rng(d)
    m = rng.standard_normal((d, d))
    a = jnp.asarray(m @ m.T / d + np.eye(d), jnp.float32)
    return lambda x: -0.5 * x @ (a @ x)


def logistic(d, n=200):
    rng = np.random.default_rng(d)
    x = jnp.asarray(rng.standard_normal((n, d)), jnp.float32)
    y = jnp.asarray(rng.random(n) < 0.5, jnp.float32)

    def logdensity(theta):
        z = x @ theta
        return jnp.sum(y * z - jnp.logaddexp(0.0, z)) - 0.5 * jnp.sum(theta**2)

    return logdensity


def cpu_per_call(fn, x, min_s=0.2):
    calls, c0, t0 = 0, time.process_time(), time.perf_counter()
    while True:
        jax.block_until_ready(fn(x))
        calls += 1
        if time.perf_counter() - t0 >= min_s:
            return (time.process_time() - c0) / calls


def measure(model, logdensity, d, n, repeats):
    x = jnp.asarray(np.random.default_rng(1).normal(0.0, 0.3, (n, d)), jnp.float32)
    fns = {
        mode: jax.jit(jax.vmap(value_and_grad(logdensity, mode)))
        for mode in ("reverse", "forward")
    }
    compile_s = {}
    for mode, fn in fns.items():
        t0 = time.perf_counter()
        jax.block_until_ready(fn(x))
        compile_s[mode] = time.perf_counter() - t0
    (vr, gr), (vf, gf) = fns["reverse"](x), fns["forward"](x)
    scale = float(jnp.max(jnp.abs(gr))) or 1.0
    times = {"reverse": [], "forward": []}
    for _ in range(repeats):
        for mode, fn in fns.items():
            times[mode].append(cpu_per_call(fn, x))
    ratios = [r / f for r, f in zip(times["reverse"], times["forward"], strict=True)]
    return dict(
        model=model,
        d=d,
        N=n,
        reverse_ms=1e3 * statistics.median(times["reverse"]),
        forward_ms=1e3 * statistics.median(times["forward"]),
        ratio_median=statistics.median(ratios),
        ratio_min=min(ratios),
        ratio_max=max(ratios),
        times_s=times,
        first_call_s=compile_s,
        max_rel_grad_diff=float(jnp.max(jnp.abs(gr - gf))) / scale,
        max_abs_value_diff=float(jnp.max(jnp.abs(vr - vf))),
    )


def main():
    p = base_parser(" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--dims", type=int, nargs="+", default=list(DIMS))
    p.add_argument("--ode-particles", type=int, default=500)
    p.add_argument("--closed-form-particles", type=int, default=2000)
    p.add_argument(
        "--models", nargs="+", default=["sir-d", "sir", "gaussian", "logistic"]
    )
    p.add_argument(
        "--all-threads",
        action="store_true",
        help="do not pin to one CPU / one XLA thread",
    )
    args = p.parse_args()
    if not args.all_threads:
        pin_to_one_cpu()
    dims = [1, 2, 5] if args.quick else args.dims
    repeats = 2 if args.quick else args.repeats
    steps = 100 if args.quick else SIR_STEPS
    rows = []
    for model in args.models:
        if model == "sir":
            prob = cj.models.inverse_problems.sir_epidemic(num_rk4_steps=steps)
            rows.append(
                measure("sir", prob.logdensity_fn, 2, args.ode_particles, repeats)
            )
            print(
                rows[-1]["model"],
                rows[-1]["d"],
                round(rows[-1]["ratio_median"], 2),
                flush=True,
            )
            continue
        for d in dims:
            if model == "sir-d":
                lp, n = sir_d(d, steps), args.ode_particles
            else:
                lp, n = (
                    (gaussian if model == "gaussian" else logistic)(d),
                    args.closed_form_particles,
                )
            rows.append(measure(model, lp, d, n, repeats))
            print(model, d, round(rows[-1]["ratio_median"], 2), flush=True)
    md = [
        dict(
            model=r["model"],
            d=r["d"],
            N=r["N"],
            **{
                "reverse ms": f"{r['reverse_ms']:.3g}",
                "forward ms": f"{r['forward_ms']:.3g}",
                "reverse / forward": f"{r['ratio_median']:.2f} [{r['ratio_min']:.2f}, "
                f"{r['ratio_max']:.2f}]",
                "faster": "forward"
                if r["ratio_min"] > 1
                else ("reverse" if r["ratio_max"] < 1 else "even"),
                "max grad diff (rel.)": f"{r['max_rel_grad_diff']:.1e}",
            },
        )
        for r in rows
    ]
    notes = [
        "Time per call of jit(vmap(value_and_grad(logdensity_fn, mode))) on N "
        "particles (values and gradients, as one LMC step needs), process CPU ms, "
        "median of the repeats; one XLA thread pinned to one CPU, float32.",
        "reverse / forward: per round (reverse and forward timed back to back), median "
        "[min, max] over rounds; > 1: forward is faster. faster: forward if every "
        "round says so, reverse likewise, else even.",
        "sir-d: the SIR model (RK4, 1,000 steps in lax.scan) with d parameters of its "
        "contact rate; sir: cj.models.inverse_problems.sir_epidemic() (d = 2); "
        "gaussian: dense precision; logistic: 200 data points.",
        f"grad_mode='auto' takes forward for d <= FORWARD_MAX_D = {FORWARD_MAX_D} "
        "(cenlmc_jax/gradients/modes.py).",
        "Shared, noisy machine: read the ratios, not the absolute times.",
    ]
    write_results(
        "grad_mode",
        dict(
            forward_max_d=FORWARD_MAX_D, dims=dims, repeats=repeats, sir_rk4_steps=steps
        ),
        rows,
        out_dir=args.out_dir,
        title="Forward vs reverse mode: time per gradient",
        notes=notes,
        md_rows=md,
    )


if __name__ == "__main__":
    main()
