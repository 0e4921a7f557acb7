"""Two skips at the start of a CEnLMC run, before and after (issue 17, item 6, last
row).

* ``f*`` at init: the CLI finds the mode (``find_f_star``) for its curvature
  probe, then ``cenlmc_init`` ran L-BFGS again from the same best particle
  (measured 8.5 s on a 4-parameter ODE model). Now ``find_f_star`` memoises
  its L-BFGS per (function, start point, tol, max_steps). Here: a
  4-parameter Lotka-Volterra posterior (RK4, 200 steps, 20 noisy observations
  of both species), ``cenlmc_init`` after a
  ``find_f_star`` with the memo emptied (before) and kept (after).
* the tuner's grid: ``tune_cenlmc`` on a target whose predicted ensemble
  fraction is 0 (the same posterior, 16 particles, h = 2e-5) with the grid
  (``skip_hopeless=False``, before) and without (after), 40 steps a trial.

Calls alternate, ``--repeats`` each, after one warm-up call of each (so no compilation
is timed); the figures are medians and the median per-repeat ratio. ``python
benchmarks/bench_init_skips.py``. Writes benchmarks/results/init_skips.{json,md}.
"""

from __future__ import annotations

import statistics
import sys
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import base_parser, write_results  # noqa: E402

import cenlmc_jax as cj  # noqa: E402
from cenlmc_jax.ensemble import tuning  # noqa: E402

TRUE = jnp.log(jnp.array([1.0, 0.4, 1.0, 0.4]))


def lotka_volterra(theta, steps=200, dt=0.05):
    """Prey and predator at every 10th of ``steps`` RK4 steps, ``theta = log(α, β, γ,
    δ)``."""
    a, b, c, d = jnp.exp(theta)

    def rhs(u):
        return jnp.stack([a * u[0] - b * u[0] * u[1], d * u[0] * u[1] - c * u[1]])

    def step(u, _):
        k1 = rhs(u)
        k2 = rhs(u + 0.5 * dt * k1)
        k3 = rhs(u + 0.5 * dt * k2)
        k4 = rhs(u + dt * k3)
        u = u + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        return u, u

    _, path = jax.lax.scan(step, jnp.array([2.0, 1.0]), None, length=steps)
    return path[9::10]


DATA = lotka_volterra(TRUE) + 0.1 * jax.random.normal(jax.random.key(0), (20, 2))


def posterior(theta):
    return -0.5 * jnp.sum((lotka_volterra(theta) - DATA) ** 2) / 0.01 - 0.5 * jnp.sum(
        (theta - TRUE) ** 2
    )


def init_call(memo: bool):
    x = TRUE + 0.3 * jax.random.normal(jax.random.key(1), (256, 4))
    tuning._LBFGS_MEMO.clear()
    tuning.find_f_star(posterior, x)  # the CLI's curvature probe
    if not memo:
        tuning._LBFGS_MEMO.clear()
    t0 = time.perf_counter()
    jax.block_until_ready(cj.ensemble.cenlmc_init(x, posterior).f_star)
    return time.perf_counter() - t0


def tune_call(skip: bool):
    x = TRUE + 0.05 * jax.random.normal(jax.random.key(1), (16, 4))
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        out = cj.tune_cenlmc(
            jax.random.key(2), posterior, x, 2e-5, f_star=F_STAR, skip_hopeless=skip
        )
    jax.block_until_ready(out.state.position)
    return time.perf_counter() - t0


F_STAR = float(tuning.find_f_star(posterior, TRUE[None] + jnp.zeros((2, 4))).f_star)


def measure(fn, repeats):
    fn(False), fn(True)  # warm-up: compile both
    times = {False: [], True: []}
    for _ in range(repeats):
        for v in (False, True):
            times[v].append(fn(v))
    ratio = statistics.median(
        b / a for b, a in zip(times[False], times[True], strict=True)
    )
    return statistics.median(times[False]), statistics.median(times[True]), ratio


def main():
    args = base_parser(" ".join(__doc__.split("\n\n")[0].split())).parse_args()
    rows = []
    for name, fn in (
        ("cenlmc_init after find_f_star (Lotka-Volterra, d = 4, N = 256)", init_call),
        (
            "tune_cenlmc, predicted fraction 0 (Lotka-Volterra, d = 4, N = 16)",
            tune_call,
        ),
    ):
        before, after, ratio = measure(fn, args.repeats)
        rows.append(
            dict(
                case=name,
                before_s=round(before, 3),
                after_s=round(after, 3),
                before_over_after=round(ratio, 1),
            )
        )
        print(rows[-1], flush=True)
    write_results(
        "init_skips",
        dict(rows=rows),
        rows,
        out_dir=args.out_dir,
        title="L-BFGS once per start point; the tuner's grid skipped where hopeless "
        "(issue 17)",
        notes=[
            f"medians of {args.repeats} alternating calls after a warm-up of each; "
            "before_over_after the median per-repeat ratio. Compilation not timed "
            "(the issue's 8.5 s and 67 s include it)."
        ],
        command="python benchmarks/bench_init_skips.py",
    )


if __name__ == "__main__":
    main()
