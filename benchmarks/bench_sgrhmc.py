"""Per-step cost of SGRHMC (docs/algorithms.md §6) against plain SGHMC from the recipe
(docs/algorithms.md §5).

All variants run the same problem — U(θ) = |θ|²/2 in d dimensions, stochastic
gradients ∇U + N(0, I) — one step vmapped over ``--chains`` chains, ``--steps``
steps per jitted ``lax.scan`` call; the figure is the median wall time of that
call divided by the number of steps (and by chains for the per-chain-step cost).

Variants:
  sghmc            recipe_step with constant D = [[0,0],[0,I]], Q = [[0,-I],[I,0]]
                   (Γ = 0, noise root precomputed): the baseline.
  sgrhmc_diag      sgrhmc_step with the paper's gSGRHMC metric 1.5·sqrt(|U+0.5|)·I
                   as a (d,) diagonal: Γ_r by jacfwd (d forward passes).
  sgrhmc_diag_naive  the same without Γ_r (what Γ costs).
  sgrhmc_dense     sgrhmc_step with a dense metric I + 0.5·tanh(θ)tanh(θ)ᵀ:
                   G^{-1/2} by eigh, Γ_r by jacfwd through it.
  sgrhmc_recipe    recipe_step with sgrhmc_dq(gSGRHMC metric): the same SGRHMC
                   through the generic (2d x 2d) recipe, to show what the
                   block-structured step saves.

Run: ``python benchmarks/bench_sgrhmc.py`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import functools
import os
import sys

import jax
import jax.numpy as jnp
from jax import lax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _common import base_parser, time_call, write_results  # noqa: E402

import cenlmc_jax as cj  # noqa: E402
from cenlmc_jax import gradients  # noqa: E402
from cenlmc_jax.sgmcmc import recipe, sgrhmc  # noqa: E402


def potential(theta):
    return 0.5 * jnp.sum(theta**2)


def dense_inv_metric(theta):
    t = jnp.tanh(theta)
    return jnp.eye(theta.shape[0], dtype=theta.dtype) + 0.5 * jnp.outer(t, t)


def build(variant: str, d: int, step_size: float):
    """(single-chain step (key, state) -> (state, info), initial single-chain state)."""
    est = gradients.noisy_grad_estimator(
        lambda t: -jax.grad(potential)(t), 1.0
    )  # ∇log π + N(0, 1)
    gs = sgrhmc.gsgrhmc_inv_metric(potential, 1.5, 0.5)
    theta0 = jnp.full((d,), 0.5)
    if variant == "sghmc":
        s = cj.sghmc(est, step_size, friction=1.0)
        return s.step, s.init(theta0)
    if variant in ("sgrhmc_diag", "sgrhmc_diag_naive"):
        step = functools.partial(
            sgrhmc.sgrhmc_step,
            grad_estimator=est,
            step_size=step_size,
            inv_metric_fn=gs,
            naive=variant.endswith("naive"),
        )
        return step, sgrhmc.sgrhmc_init(theta0)
    if variant == "sgrhmc_dense":
        step = functools.partial(
            sgrhmc.sgrhmc_step,
            grad_estimator=est,
            step_size=step_size,
            inv_metric_fn=dense_inv_metric,
        )
        return step, sgrhmc.sgrhmc_init(theta0)
    if variant == "sgrhmc_recipe":
        D, Q = sgrhmc.sgrhmc_dq(gs)

        def grad_h(key, z):  # ∇log π(θ, r) = (∇log π(θ), -r)
            return jnp.concatenate([est(key, z[:d]), -z[d:]])

        step = functools.partial(
            recipe.recipe_step, grad_estimator=grad_h, step_size=step_size, D=D, Q=Q
        )
        return step, recipe.recipe_init(jnp.concatenate([theta0, jnp.zeros(d)]))
    raise ValueError(variant)


def make_run(single_step, num_chains: int, num_steps: int):
    vstep = jax.vmap(single_step)

    def body(state, key):
        state, info = vstep(jax.random.split(key, num_chains), state)
        return state, jnp.mean(info.diverged)

    @jax.jit
    def run(key, state):
        state, div = lax.scan(body, state, jax.random.split(key, num_steps))
        return state, div.mean()

    return run


def main():
    parser = base_parser(" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--chains", type=int, default=10_000)
    parser.add_argument("--dims", type=int, nargs="+", default=[1, 10])
    parser.add_argument(
        "--steps", type=int, default=100, help="steps per timed (jitted lax.scan) call"
    )
    parser.add_argument("--step-size", type=float, default=0.02)
    args = parser.parse_args()
    if args.quick:
        args.chains, args.dims, args.steps, args.repeats = 1000, [1, 4], 20, 3

    variants = [
        "sghmc",
        "sgrhmc_diag",
        "sgrhmc_diag_naive",
        "sgrhmc_dense",
        "sgrhmc_recipe",
    ]
    rows = []
    for d in args.dims:
        base = None
        for v in variants:
            single, state0 = build(v, d, args.step_size)
            states = jax.tree_util.tree_map(
                lambda a: jnp.broadcast_to(a, (args.chains,) + a.shape), state0
            )
            run = make_run(single, args.chains, args.steps)
            t = time_call(run, jax.random.key(0), states, repeats=args.repeats)
            _, div = run(jax.random.key(0), states)
            per_step = t.median_s / args.steps
            if v == "sghmc":
                base = per_step
            rows.append(
                dict(
                    variant=v,
                    d=d,
                    chains=args.chains,
                    per_step_ms=per_step * 1e3,
                    per_chain_step_ns=per_step / args.chains * 1e9,
                    ratio_vs_sghmc=per_step / base,
                    compile_s=t.first_call_s,
                    diverged_frac=float(div),
                    timing=t.as_dict(),
                )
            )
            print(
                f"d={d:3d} {v:18s} {per_step * 1e3:9.3f} ms/step  "
                f"x{per_step / base:5.2f} vs sghmc",
                flush=True,
            )

    notes = [
        f"{args.chains} chains vmapped, {args.steps} steps per jitted lax.scan call, "
        f"median of {args.repeats} calls; per-step time = median / steps.",
        f"U = |θ|²/2, gradients ∇U + N(0, I), step size {args.step_size}; every "
        "variant runs the same chains (diverged_frac should be 0).",
        "Shared 2-core machine at the time of writing: absolute numbers are noisy; "
        "the ratios in one run are the figure.",
    ]
    columns = [
        "variant",
        "d",
        "chains",
        "per_step_ms",
        "per_chain_step_ns",
        "ratio_vs_sghmc",
        "compile_s",
        "diverged_frac",
    ]
    write_results(
        "sgrhmc",
        dict(
            args={k: (str(v) if k == "out_dir" else v) for k, v in vars(args).items()}
        ),
        rows,
        columns=columns,
        out_dir=args.out_dir,
        title="SGRHMC vs SGHMC (complete recipe): per-step time, vmapped chains",
        notes=notes,
    )


if __name__ == "__main__":
    main()
