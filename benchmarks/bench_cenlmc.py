"""CEnLMC vs LMC: gradient evaluations, model evaluations and wall time at matched
accuracy.

Both samplers run the same ensemble (N particles, step size h, same number of
steps) on a Gaussian target wrapped as an **expensive model**:

* a value costs one "model solve" (``--model-iters`` fixed-point iterations
  ``z <- tanh(A z + B x)`` of a ``--hidden``-dimensional state; the solve's
  output enters the log density as ``1e-6 · tanh(mean z)``, so the target is
  the Gaussian up to a density factor within ``e^{±1e-6}``, far below the
  Monte-Carlo error);
* a gradient costs ``--grad-cost`` (default 20) solves: it is computed, as for a
  black-box model without an adjoint, by central finite differences (2d solves
  per stencil) averaged over ``ceil(grad_cost / 2d)`` step sizes — 20 solves for
  d = 2 (5 stencils) and for d = 5 (2 stencils). The measured time ratio
  gradient / value is reported (``grad_over_value_time``).

LMC needs ``1 + grad_cost`` solves per particle and step (``value_and_grad``);
CEnLMC needs 1 solve per particle (the value at the new point) plus
``grad_cost`` per particle that fails a test of eq. 3.21 (padded to the
gradient buffer), plus the O(N²) pair sum. Accuracy: per coordinate, the
stationary variance from per-particle time averages of x² (mean 0 known),
against the target (1) and against the exact ULA variance 1/(1 - h/2), with
its standard error (the N per-particle averages taken as independent).

Default configurations: d = 2 with docs/algorithms.md's measured parameters (η = 0.3,
R1 = 0.5, R2 = 0.3, M_f = 10, N* = 20·N/4000) and d = 5 with
``suggest_cenlmc_params`` and with a forced, more aggressive setting, to show
what the ensemble does (and costs in accuracy) in 5-D at CPU-sized N.
Run: ``python benchmarks/bench_cenlmc.py`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import functools
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
from _common import base_parser, time_call, write_results

from cenlmc_jax.ensemble import cenlmc_init, cenlmc_step
from cenlmc_jax.ensemble.lmc import lmc_init, lmc_step
from cenlmc_jax.ensemble.tuning import suggest_cenlmc_params
from cenlmc_jax.models import targets
from cenlmc_jax.pairwise import ensemble_force


def expensive_model(
    base_logdensity, dim, *, model_iters, grad_cost, hidden, seed=0, delta=1e-2
):
    """Wrap ``base_logdensity`` so a value costs 1 model solve and a gradient ``≈
    grad_cost`` solves.

    Returns ``(logdensity_fn, solves_per_grad)``.
    """
    rng = np.random.default_rng(seed)
    a = jnp.asarray(
        0.9 * rng.standard_normal((hidden, hidden)) / math.sqrt(hidden), jnp.float32
    )
    b = jnp.asarray(rng.standard_normal((hidden, dim)), jnp.float32)

    def solve(x):
        c = b.astype(x.dtype) @ x
        z = jax.lax.fori_loop(
            0,
            model_iters,
            lambda i, z: jnp.tanh(a.astype(x.dtype) @ z + c),
            jnp.zeros((hidden,), x.dtype),
        )
        return jnp.tanh(jnp.mean(z))

    def value(x):
        return base_logdensity(x) + 1e-6 * solve(x)

    stencils = max(1, math.ceil(grad_cost / (2 * dim)))
    eye = jnp.eye(dim)

    @jax.custom_vjp
    def logdensity(x):
        return value(x)

    def fwd(x):
        return value(x), x

    steps = delta * jnp.arange(
        1, stencils + 1
    )  # central differences at these step sizes, averaged

    def bwd(x, g):
        offsets = (steps[:, None, None] * eye[None]).astype(x.dtype)  # (stencils, d, d)
        pts = jnp.concatenate([x + offsets, x - offsets], axis=0).reshape(
            -1, dim
        )  # all 2·d·stencils solves
        vals = jax.vmap(value)(pts).reshape(2, stencils, dim)
        grads = (vals[0] - vals[1]) / (2 * steps[:, None].astype(x.dtype))
        return (g * jnp.mean(grads, axis=0),)

    logdensity.defvjp(fwd, bwd)
    return logdensity, 2 * dim * stencils


def make_runner(step_fn, num_steps, thin):
    """Jitted ``lax.scan`` over ``num_steps``: keep positions every ``thin`` steps and
    per-step infos."""

    def run(key, state):
        def one(state, t):
            state, info = step_fn(jax.random.fold_in(key, t), state)
            return state, info

        def outer(state, j):
            state, infos = jax.lax.scan(one, state, j * thin + jnp.arange(thin))
            return state, (state.position, infos)

        state, (kept, infos) = jax.lax.scan(outer, state, jnp.arange(num_steps // thin))
        infos = jax.tree_util.tree_map(lambda v: v.reshape((-1,) + v.shape[2:]), infos)
        return state, kept, infos

    return jax.jit(run)


def timed_run(step_fn, state, num_steps, thin, repeats):
    runner = make_runner(step_fn, num_steps, thin)
    key = jax.random.key(1)
    t0 = time.perf_counter()
    compiled = runner.lower(key, state).compile()
    compile_s = time.perf_counter() - t0
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = jax.block_until_ready(compiled(key, state))
        times.append(time.perf_counter() - t0)
    return out, float(np.median(times)), float(np.min(times)), compile_s


def variance_accuracy(kept, burn_kept, h):
    x = np.asarray(kept[burn_kept:], np.float64)  # (T, N, d)
    per = (x**2).mean(axis=0)  # (N, d) per-particle averages; mean 0 known
    var, se = per.mean(axis=0), per.std(axis=0, ddof=1) / math.sqrt(per.shape[0])
    ula = 1.0 / (1.0 - h / 2.0)
    return dict(
        var_err_vs_target=float(np.max(np.abs(var - 1.0))),
        var_err_vs_ula=float(np.max(np.abs(var - ula))),
        var_se=float(np.max(se)),
        max_z_vs_ula=float(np.max(np.abs(var - ula) / se)),
    )


def bench_config(
    label, dim, n, h, steps, burn_in, thin, params, model, grad_cost_solves, repeats
):
    tgt = targets.standard_gaussian(dim)
    logdensity = model
    x0 = tgt.sample(jax.random.key(0), n)
    burn_kept = burn_in // thin
    rows = []

    lmc_state = lmc_init(x0, logdensity)
    lmc = functools.partial(lmc_step, logdensity_fn=logdensity, step_size=h)
    (_, kept, infos), wall, wall_min, comp = timed_run(
        lmc, lmc_state, steps, thin, repeats
    )
    grads = int(np.sum(infos.grad_evals))
    rows.append(
        dict(
            config=label,
            sampler="LMC",
            d=dim,
            N=n,
            h=h,
            steps=steps,
            ensemble_fraction=0.0,
            grad_evals=grads,
            grad_evals_padded=grads,
            model_solves=steps * n + grad_cost_solves * grads,
            wall_s=round(wall, 3),
            wall_min_s=round(wall_min, 3),
            compile_s=round(comp, 2),
            **variance_accuracy(kept, burn_kept, h),
        )
    )

    c_state = cenlmc_init(x0, logdensity, tgt.f_star)
    cen = functools.partial(
        cenlmc_step, logdensity_fn=logdensity, step_size=h, **params
    )
    (_, kept, infos), wall, wall_min, comp = timed_run(
        cen, c_state, steps, thin, repeats
    )
    grads, padded = int(np.sum(infos.grad_evals)), int(np.sum(infos.grad_evals_padded))
    frac = float(np.mean(np.asarray(infos.ensemble_fraction)[burn_in:]))
    rows.append(
        dict(
            config=label,
            sampler="CEnLMC",
            d=dim,
            N=n,
            h=h,
            steps=steps,
            ensemble_fraction=round(frac, 4),
            grad_evals=grads,
            grad_evals_padded=padded,
            model_solves=steps * n + grad_cost_solves * padded,
            wall_s=round(wall, 3),
            wall_min_s=round(wall_min, 3),
            compile_s=round(comp, 2),
            **variance_accuracy(kept, burn_kept, h),
            params={
                k: (round(v, 4) if isinstance(v, float) else v)
                for k, v in params.items()
            },
        )
    )
    lm, ce = rows
    ce["grad_saving"] = round(lm["grad_evals"] / max(ce["grad_evals_padded"], 1), 3)
    ce["solve_saving"] = round(lm["model_solves"] / ce["model_solves"], 3)
    ce["wall_speedup"] = round(lm["wall_s"] / ce["wall_s"], 3)
    ce["wall_speedup_min"] = round(lm["wall_min_s"] / ce["wall_min_s"], 3)
    return rows


def cost_probe(model, dim, n, repeats):
    """Per-call times of the model's value and gradient, and of one pair sum, at N
    particles."""
    x = jax.random.normal(jax.random.key(3), (n, dim))
    val = jax.jit(jax.vmap(model))
    grad = jax.jit(jax.vmap(jax.grad(model)))
    tv = time_call(val, x, repeats=repeats, min_run_s=0.05)
    tg = time_call(grad, x, repeats=repeats, min_run_s=0.05)
    f = -val(x)
    log_p = jnp.full((n,), -1.0)
    pair = jax.jit(lambda x, f, lp, w: ensemble_force(x, f, lp, 0.3, w=w, r2=0.3))
    tp = time_call(pair, x, f, log_p, x, repeats=repeats, min_run_s=0.05)
    return dict(
        d=dim,
        N=n,
        value_s=tv.median_s,
        grad_s=tg.median_s,
        pair_sum_s=tp.median_s,
        grad_over_value_time=tg.median_s / tv.median_s,
    )


def main():
    p = base_parser(" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--particles", type=int, default=2000)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument(
        "--burn-in",
        type=int,
        default=100,
        help="steps left out of the accuracy estimate",
    )
    p.add_argument("--thin", type=int, default=5)
    p.add_argument(
        "--model-iters",
        type=int,
        default=20,
        help="fixed-point iterations per model solve",
    )
    p.add_argument("--hidden", type=int, default=16, help="model state dimension")
    p.add_argument(
        "--grad-cost", type=int, default=20, help="model solves per gradient"
    )
    p.add_argument("--dims", type=int, nargs="+", default=[2, 5])
    p.set_defaults(repeats=3)
    args = p.parse_args()
    n, steps, burn_in = (
        (500, 100, 40) if args.quick else (args.particles, args.steps, args.burn_in)
    )
    thin = args.thin

    rows, probes = [], []
    for dim in args.dims:
        model, solves = expensive_model(
            targets.standard_gaussian(dim).logdensity_fn,
            dim,
            model_iters=args.model_iters,
            grad_cost=args.grad_cost,
            hidden=args.hidden,
        )
        probes.append(cost_probe(model, dim, n, repeats=3))
        configs = []
        if dim == 2:
            configs.append(
                (
                    "spec",
                    0.05,
                    dict(
                        eta=0.3,
                        r1=0.5,
                        r2=0.3,
                        n_star=max(1, round(20 * n / 4000)),
                        m_f=10.0,
                    ),
                )
            )
        else:
            s = suggest_cenlmc_params(dim, 0.05, num_particles=n)
            configs.append(
                (
                    "suggested",
                    0.05,
                    dict(eta=s.eta, r1=s.r1, r2=s.r2, n_star=s.n_star, m_f=s.m_f),
                )
            )
            configs.append(
                (
                    "forced",
                    0.1,
                    dict(
                        eta=0.7,
                        r1=1.1,
                        r2=0.6,
                        n_star=max(1, round(10 * n / 4000)),
                        m_f=7.5,
                    ),
                )
            )
        for label, h, params in configs:
            print(
                f"d={dim} {label}: running LMC and CEnLMC, N={n}, {steps} steps ...",
                flush=True,
            )
            rows += bench_config(
                f"{dim}d-{label}",
                dim,
                n,
                h,
                steps,
                burn_in,
                thin,
                params,
                model,
                solves,
                args.repeats,
            )
            print("   ", rows[-1], flush=True)

    columns = [
        "config",
        "sampler",
        "N",
        "h",
        "ensemble_fraction",
        "grad_evals",
        "grad_evals_padded",
        "model_solves",
        "wall_s",
        "var_err_vs_target",
        "var_err_vs_ula",
        "var_se",
        "max_z_vs_ula",
        "grad_saving",
        "solve_saving",
        "wall_speedup",
        "wall_speedup_min",
    ]
    probe_txt = "; ".join(
        f"d={q['d']}: value {q['value_s'] * 1e3:.2f} ms, gradient "
        f"{q['grad_s'] * 1e3:.2f} ms (x{q['grad_over_value_time']:.1f}), pair sum "
        f"{q['pair_sum_s'] * 1e3:.2f} ms for N={q['N']}"
        for q in probes
    )
    write_results(
        "cenlmc",
        {"args": vars(args), "cost_probe": probes},
        rows,
        columns=columns,
        out_dir=args.out_dir,
        title="CEnLMC vs LMC with an expensive gradient",
        notes=[
            "Expensive model: a value = 1 model solve, a gradient = finite "
            f"differences over {args.grad_cost} solves (see the script's docstring). "
            f"Measured per call at N particles: {probe_txt}.",
            "grad_evals: gradients the algorithm needed; grad_evals_padded: computed "
            "(buffer padding); model_solves = steps·N values + "
            "grad_cost·grad_evals_padded.",
            "var_err_vs_target = max_k |Var x_k - 1|; var_err_vs_ula = max_k |Var x_k "
            "- 1/(1-h/2)| (ULA's exact variance); var_se its standard error "
            f"(per-particle time averages as independent); burn-in {burn_in} steps "
            "excluded.",
            f"wall_s: median of {args.repeats} compiled runs (compilation excluded), "
            "wall_min_s their minimum; taken on a shared, noisy machine: rerun on a "
            "quiet one.",
            "grad_saving, solve_saving, wall_speedup(_min): LMC / CEnLMC.",
        ],
    )


if __name__ == "__main__":
    main()
