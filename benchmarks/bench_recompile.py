"""A rebuilt ``cj.cenlmc(...)`` with the same parameters: compiled again, or reused
(issue 17, item 6).

Before, every sampler object's ``step`` was a new closure, and ``cj.sample``
keeps one compiled chunk per step function (``run._chunk_fn``): building the
sampler again with identical parameters (a notebook cell run twice, a loop over
seeds or data sets of one model) traced and compiled the whole run again. After,
the step comes from ``cenlmc_jax._steps.bound_step``: the same function object for
equal parameters, so the second ``cj.sample`` reuses the first one's compiled chunk.

Both variants in one process, on the SIR model (d = 2, RK4 in ``lax.scan``,
``cj.models.inverse_problems.sir_epidemic``), CEnLMC with N particles, ``--steps``
steps: for each of ``--repeats`` rounds, the sampler is built afresh and run once per
variant (the order alternating), "before" with its step wrapped in a new closure (what
the constructors returned), "after" as the constructor returns it. A round's time is the
wall time of ``cj.sample`` (compilation included); the first round of "after" compiles,
the later ones reuse. Both give the same draws (checked).

``python benchmarks/bench_recompile.py`` (``--quick``: a Gaussian, fewer steps).
Writes benchmarks/results/recompile.{json,md}.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import base_parser, write_results  # noqa: E402

import cenlmc_jax as cj  # noqa: E402


def _target(quick: bool):
    if quick:
        return cj.models.targets.standard_gaussian(2)
    return cj.models.inverse_problems.sir_epidemic().as_target()


def _run(algo, x0, steps):
    start = time.perf_counter()
    res = cj.sample(
        jax.random.key(1),
        algo,
        algo.init(x0),
        steps,
        check_convergence=False,
        on_divergence="warn",
    )
    jax.block_until_ready(res.state.position)
    return time.perf_counter() - start, np.asarray(res.state.position)


def main():
    parser = base_parser(" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--particles", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    if args.quick:
        args.particles, args.steps, args.repeats = 200, 10, 2
    tgt = _target(args.quick)
    x0 = jax.random.normal(jax.random.key(0), (args.particles, tgt.dim))

    def build():
        return cj.cenlmc(
            tgt.logdensity_fn, 0.05, 0.3, 0.5, 0.3, 5, 10.0, f_star=tgt.f_star
        )

    times = {"before": [], "after": []}
    for r in range(args.repeats):
        order = ("before", "after") if r % 2 == 0 else ("after", "before")
        out = {}
        for variant in order:
            algo = build()
            if (
                variant == "before"
            ):  # a fresh closure per build, as the constructors returned
                step = algo.step
                algo = cj.base.SamplingAlgorithm(
                    algo.init, lambda key, state, step=step: step(key, state)
                )
            seconds, out[variant] = _run(algo, x0, args.steps)
            times[variant].append(seconds)
            print(f"round {r} {variant}: {seconds:.2f} s", flush=True)
        np.testing.assert_array_equal(
            out["before"], out["after"]
        )  # the same run either way
    rows = []
    for variant in ("before", "after"):
        t = times[variant]
        rows.append(
            dict(
                variant=variant,
                first_s=round(t[0], 3),
                later_median_s=round(statistics.median(t[1:]), 3)
                if len(t) > 1
                else None,
                later_times_s=[round(x, 3) for x in t[1:]],
            )
        )
    ratio = [
        b / a for b, a in zip(times["before"][1:], times["after"][1:], strict=True)
    ]
    rows.append(
        dict(
            variant="before / after (later rounds)",
            later_median_s=round(statistics.median(ratio), 1) if ratio else None,
        )
    )
    notes = [
        f"{'Gaussian (quick)' if args.quick else 'SIR (d = 2, RK4 in lax.scan)'}, "
        f"CEnLMC, N = {args.particles}, {args.steps} steps per cj.sample; the sampler "
        f"rebuilt with identical parameters each round; {args.repeats} rounds, "
        "variants alternating.",
        "before: the step a fresh closure per build (what the constructors returned); "
        "after: cenlmc_jax._steps.bound_step (equal parameters, the same step "
        "function: cj.sample's compiled chunk is reused).",
        "first_s: the first round (compiles in both); later: the rounds after it. Same "
        "draws in both (checked).",
    ]
    write_results(
        "recompile",
        dict(args={k: v for k, v in vars(args).items() if k != "out_dir"}),
        rows,
        out_dir=args.out_dir,
        notes=notes,
        title="A rebuilt cj.cenlmc with the same parameters: compiled again (before) "
        "or reused (after)",
        command="python benchmarks/bench_recompile.py"
        + (" --quick" if args.quick else ""),
    )


if __name__ == "__main__":
    main()
