"""Irreversible Gamma sampler vs Gaussian random-walk MH: ESS per step and per second.

Spec section 7: the irreversible jump sampler with the Gamma proposal
``z*_i = z_i + s_i Gamma(k, θ)`` (accept keeps the direction, reject flips it)
against the reversible baseline, RW-MH with ``z* = z + σ ξ``. Both are tuned
to the same acceptance rate (default 0.5) by :func:`tune_to_acceptance` (a
vectorised grid search: the acceptance of every scale on a log grid from one
compiled call, then linear interpolation of log-scale in acceptance), then run
with many vmapped chains through ``cenlmc_jax.sample``.

Targets: the 1-D double well ``U = θ⁴ - 2θ²`` and the 2-D banana
(``cenlmc_jax.models.targets``). Chains start from exact draws (the double well's by
inverting its quadrature CDF), so no burn-in is needed.

Reported per (target, sampler): acceptance, lag-1 and lag-5 autocorrelation
(coordinate 0 and the worst coordinate), multi-chain ESS (min over
coordinates), ESS per draw (per chain-step), ESS per second of the whole
vmapped run (median wall time of ``--repeats`` runs, compilation excluded), and
z-scores of the mean and second moment against the truth (a correctness check).
Ratios Gamma / RW-MH are in the last rows.

Run: ``python benchmarks/bench_irreversible.py`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from _common import base_parser, time_call, write_results

import cenlmc_jax as cj
from cenlmc_jax import diagnostics as dg
from cenlmc_jax import irreversible as irr
from cenlmc_jax.models import targets
from cenlmc_jax.run import vmap_chains


def double_well_draws(n: int, seed: int) -> jax.Array:
    """Exact draws from p ∝ exp(-(θ⁴ - 2θ²)) by inverting the trapezoid-rule CDF on [-6,
    6]."""
    grid = np.linspace(-6.0, 6.0, 400_001)
    dens = np.exp(-(grid**4 - 2 * grid**2) - 1.0)
    cdf = np.concatenate([[0.0], np.cumsum((dens[1:] + dens[:-1]) / 2 * np.diff(grid))])
    u = np.random.default_rng(seed).uniform(size=n) * cdf[-1]
    return jnp.asarray(np.interp(u, cdf, grid)[:, None], jnp.float32)


def make_sampler(kind: str, logdensity_fn, gamma_shape: float):
    """(init(x0, key), step(key, state, scale)) for one chain; ``scale`` may be a
    tracer."""
    if kind == "gamma":

        def init(x, key):
            return irr.irreversible_mh_init(x, logdensity_fn, key)

        def step(key, state, scale):
            return irr.irreversible_mh_step(
                key, state, logdensity_fn, irr.gamma_proposal(gamma_shape, scale)
            )
    else:

        def init(x, key):
            return irr.rwmh_init(x, logdensity_fn)

        def step(key, state, scale):
            return irr.rwmh_step(key, state, logdensity_fn, step_size=scale)

    return init, step


def tune_to_acceptance(init, step, x0, grid, target_acceptance, num_steps=300, seed=0):
    """Scale with acceptance ``target_acceptance``: every scale of ``grid`` in one
    vmapped call.

    Each grid value runs ``len(x0)`` chains for ``num_steps`` steps from ``x0``
    (exact draws, so the acceptance is the stationary one); the acceptance
    decreases with the scale, so log-scale is interpolated linearly in the
    acceptance. Returns (scale, grid acceptances).
    """
    n = x0.shape[0]
    state0 = jax.vmap(init)(x0, jax.random.split(jax.random.key(seed + 1), n))

    def acceptance(scale):
        def one(state, key):
            state, info = jax.vmap(lambda k, s: step(k, s, scale))(
                jax.random.split(key, n), state
            )
            return state, jnp.mean(info.is_accepted.astype(jnp.float32))

        _, acc = jax.lax.scan(
            one, state0, jax.random.split(jax.random.key(seed), num_steps)
        )
        return jnp.mean(acc)

    grid = np.asarray(grid, np.float32)
    acc = np.asarray(jax.jit(jax.vmap(acceptance))(jnp.asarray(grid)))
    order = np.argsort(acc)  # np.interp needs increasing x
    scale = float(np.exp(np.interp(target_acceptance, acc[order], np.log(grid[order]))))
    return scale, acc


def lag_acf(trace: np.ndarray, lag: int) -> np.ndarray:
    """Autocorrelation at ``lag`` per coordinate, pooled over chains: trace (chains,
    draws, d)."""
    x = trace - trace.mean(axis=(0, 1))
    return np.mean(x[:, :-lag] * x[:, lag:], axis=(0, 1)) / np.mean(x**2, axis=(0, 1))


def main():
    parser = base_parser(" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--chains", type=int, default=2000, help="vmapped chains")
    parser.add_argument(
        "--steps", type=int, default=2000, help="recorded steps per chain"
    )
    parser.add_argument(
        "--acceptance", type=float, default=0.5, help="common target acceptance rate"
    )
    parser.add_argument(
        "--gamma-shape", type=float, default=2.0, help="shape k of the Gamma jumps"
    )
    args = parser.parse_args()
    if args.quick:
        args.chains, args.steps, args.repeats = 200, 400, 2

    problems = {
        "double_well_1d": (targets.double_well(), lambda n: double_well_draws(n, 0)),
        "banana_2d": (
            targets.banana(),
            lambda n: targets.banana().sample(jax.random.key(0), n),
        ),
    }
    grids = {"gamma": np.geomspace(0.1, 3.0, 24), "rw": np.geomspace(0.2, 8.0, 24)}
    rows, raw = [], {}
    for pname, (tgt, draw) in problems.items():
        x0 = draw(args.chains)
        per = {}
        for kind in ("gamma", "rw"):
            init, step = make_sampler(kind, tgt.logdensity_fn, args.gamma_shape)
            scale, grid_acc = tune_to_acceptance(
                init, step, x0[: min(500, args.chains)], grids[kind], args.acceptance
            )
            state = jax.vmap(init)(x0, jax.random.split(jax.random.key(1), args.chains))
            one = functools.partial(step, scale=scale)
            step_fn = vmap_chains(one)

            def run(step_fn=step_fn, state=state):
                res = cj.sample(jax.random.key(2), step_fn, state, args.steps)
                return res.trace, res.info

            timing = time_call(run, repeats=args.repeats)
            trace_j, info = run()
            trace = np.asarray(trace_j, np.float64).transpose(
                1, 0, 2
            )  # (chains, draws, d)
            ess = np.asarray(dg.effective_sample_size(trace), np.float64)
            draws = trace.shape[0] * trace.shape[1]
            mom = np.concatenate([trace, trace**2], axis=-1)
            truth = np.concatenate([tgt.mean, np.diag(tgt.cov) + tgt.mean**2])
            z = (mom.mean(axis=(0, 1)) - truth) / np.asarray(dg.mcse(mom))
            acf1, acf5 = lag_acf(trace, 1), lag_acf(trace, 5)
            row = dict(
                target=pname,
                sampler="irreversible Gamma" if kind == "gamma" else "RW-MH",
                scale=(
                    f"θ={scale:.3g} (k={args.gamma_shape:g})"
                    if kind == "gamma"
                    else f"σ={scale:.3g}"
                ),
                acceptance=float(np.mean(info.is_accepted)),
                acf1_x0=float(acf1[0]),
                acf5_x0=float(acf5[0]),
                acf5_max_abs=float(np.max(np.abs(acf5))),
                ess_min=float(ess.min()),
                ess_per_draw=float(ess.min() / draws),
                ess_per_s=float(ess.min() / timing.median_s),
                run_s=timing.median_s,
                max_abs_z=float(np.max(np.abs(z))),
            )
            rows.append(row)
            per[kind] = row
            raw[f"{pname}/{kind}"] = dict(
                scale=scale,
                tuning_grid=grids[kind],
                tuning_acceptance=grid_acc,
                ess=ess,
                acf1=acf1,
                acf5=acf5,
                z_mean_and_second_moment=z,
                timing=timing.as_dict(),
            )
        g, r = per["gamma"], per["rw"]
        rows.append(
            dict(
                target=pname,
                sampler="ratio Gamma / RW-MH",
                scale="-",
                acceptance=g["acceptance"] / r["acceptance"],
                acf5_x0=None,
                acf1_x0=None,
                acf5_max_abs=g["acf5_max_abs"] / r["acf5_max_abs"],
                ess_min=g["ess_min"] / r["ess_min"],
                ess_per_draw=g["ess_per_draw"] / r["ess_per_draw"],
                ess_per_s=g["ess_per_s"] / r["ess_per_s"],
                run_s=g["run_s"] / r["run_s"],
                max_abs_z=None,
            )
        )

    columns = [
        "target",
        "sampler",
        "scale",
        "acceptance",
        "acf1_x0",
        "acf5_x0",
        "acf5_max_abs",
        "ess_min",
        "ess_per_draw",
        "ess_per_s",
        "run_s",
        "max_abs_z",
    ]
    notes = [
        f"{args.chains} vmapped chains x {args.steps} steps, float32, chains started "
        "from exact draws (no burn-in); both samplers tuned to acceptance "
        f"{args.acceptance} by a vectorised grid search (tune_to_acceptance).",
        "ess_min: multi-chain ESS (cenlmc_jax.diagnostics), smallest over coordinates; "
        "ess_per_draw = ess_min / (chains x steps); ess_per_s = ess_min / median wall "
        "time of one whole run (compilation excluded).",
        "acf*_x0: pooled lag autocorrelation of coordinate 0; acf5_max_abs: max over "
        "coordinates of |lag-5 ACF|.",
        "max_abs_z: largest |z| of the mean and second moment of every coordinate "
        "against the truth (MCSE from ESS): a correctness check, expected below ~4.",
        "Wall times on a shared machine are noisy; rerun the command on a quiet "
        "machine for speed figures.",
    ]
    payload = dict(
        config=dict(
            chains=args.chains,
            steps=args.steps,
            acceptance=args.acceptance,
            gamma_shape=args.gamma_shape,
            repeats=args.repeats,
            quick=args.quick,
        ),
        details=raw,
    )
    json_path, md_path = write_results(
        "irreversible",
        payload,
        rows,
        columns=columns,
        out_dir=args.out_dir,
        title="Irreversible Gamma sampler vs random-walk MH (docs/algorithms.md §7)",
        notes=notes,
    )
    print(md_path.read_text())


if __name__ == "__main__":
    main()
