"""Where a CEnLMC step of the CLI's main job spends its time: the pair force against
everything else.

The step is ``cenlmc-jax sample``'s (a 2-D standard Gaussian, N = 2,000, the tuner's
h, eta, R1, R2, N*, M_f as the CLI prints them), from an ensemble that has run 50
steps. Three compiled programs, timed interleaved on the same state and key:

* ``step``: the step as the CLI runs it;
* ``force``: its pair force alone (``ensemble_force`` with the step's arguments);
* ``step_without_force``: the step with ``ensemble_force`` replaced by a stub that
  returns zeros of the same shapes and 10 neighbours for every particle (so the
  R2 test passes, and the gradients, the audit, the move and the values run as
  in a step where the ensemble is used; the decisions differ from the real
  step's, so this is the rest's cost, not an exact split).

CPU time of the process a call (XLA on one thread, as the CLI runs a small
ensemble), the median over ``--repeats`` rounds of 200 calls each, and the
per-round ratios.

Run: ``python benchmarks/bench_step_parts.py [--repeats 7]``
(result: ``benchmarks/results/step_parts.md``).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

# one XLA thread, as the CLI runs a small ensemble (cenlmc_jax.cli.jobs.POOL_ENV)
os.environ.setdefault("PJRT_NPROC", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import cenlmc_jax as cj  # noqa: E402
from cenlmc_jax.ensemble import cenlmc as cenlmc_module  # noqa: E402
from cenlmc_jax.ensemble import tuning  # noqa: E402
from cenlmc_jax.pairwise import ensemble_force  # noqa: E402
from cenlmc_jax.pairwise.algebra import PairwiseForce  # noqa: E402

N, D = 2000, 2
CALLS = 200


def stub_force(x, f, log_p, eta, *, w=None, r2=None, return_fallback=False, **kw):
    """Zeros of the force's shapes, 10 neighbours a particle (no pair is visited)."""
    count = jnp.full((x.shape[0],), 10, jnp.int32)
    out = PairwiseForce(jnp.zeros_like(x), count, count)
    return (out, jnp.asarray(False)) if return_fallback else out


def main():
    from _common import base_parser, machine_info, write_results

    parser = base_parser(" ".join(__doc__.split("\n\n")[0].split()))
    args = parser.parse_args()
    repeats = 3 if args.quick else args.repeats
    h = min(0.05, (2.0 / N) ** 0.5)  # the CLI's default step (curvature 1)
    p = tuning.suggest_cenlmc_params(D, h, L=1.0, mu=1.0, num_particles=N)

    def logdensity(x):
        return -0.5 * jnp.sum(x**2)

    def build(logdensity):
        return cj.cenlmc(logdensity, h, p.eta, p.r1, p.r2, p.n_star, p.m_f, f_star=0.0)

    algo = build(logdensity)
    state = algo.init(jax.random.normal(jax.random.key(1), (N, D)))
    key = jax.random.key(0)
    run = jax.jit(algo.step)
    for t in range(50):
        state, _ = run(jax.random.fold_in(key, t), state)
    x, f = state.position, -state.logdensity

    def force_only(x, f, log_p, w):
        return ensemble_force(x, f, log_p, p.eta, w=w, r2=p.r2, return_fallback=True)

    fargs = (x, f, state.log_p, state.w)
    programs = {
        "step": (jax.jit(algo.step).lower(key, state).compile(), (key, state)),
        "force": (jax.jit(force_only).lower(*fargs).compile(), fargs),
    }
    cenlmc_module.ensemble_force = stub_force  # traced into the next program only
    try:
        # a new function object: a new trace (the sampler's step is cached per
        # log density, and jit per function)
        stub = build(lambda x: logdensity(x))
        programs["step_without_force"] = (
            jax.jit(stub.step).lower(key, state).compile(),
            (key, state),
        )
    finally:
        cenlmc_module.ensemble_force = ensemble_force
    times = {name: [] for name in programs}
    for _ in range(repeats):
        for name, (fn, fn_args) in programs.items():
            jax.block_until_ready(fn(*fn_args))
            t = time.process_time()
            for _ in range(CALLS):
                out = fn(*fn_args)
            jax.block_until_ready(out)
            times[name].append((time.process_time() - t) / CALLS * 1e3)
    rows = []
    for name, ts in times.items():
        ratio = [a / b for a, b in zip(ts, times["step"], strict=True)]
        rows.append(
            dict(
                program=name,
                cpu_ms=statistics.median(ts),
                of_step=statistics.median(ratio),
                ratio_range=[round(min(ratio), 3), round(max(ratio), 3)],
            )
        )
        print(rows[-1], flush=True)
    write_results(
        "step_parts",
        dict(
            repeats=repeats,
            calls=CALLS,
            n=N,
            d=D,
            params=dict(h=h, eta=p.eta, r1=p.r1, r2=p.r2, n_star=p.n_star, m_f=p.m_f),
            machine=machine_info(),
        ),
        rows,
        out_dir=args.out_dir,
        title="A CEnLMC step of the CLI's main job: the pair force and the rest",
        notes=[
            f"N = {N}, d = {D}, the tuner's parameters at the CLI's default h; "
            "process CPU ms a call (one XLA thread), median over the rounds; of_step: "
            "the median per-round ratio to the whole step.",
            "step_without_force: the step with the pair force replaced by a stub "
            "(zeros, 10 neighbours a particle): the cost of everything else, with "
            "the decisions of a step that uses the ensemble (not the real step's).",
        ],
    )


if __name__ == "__main__":
    main()
