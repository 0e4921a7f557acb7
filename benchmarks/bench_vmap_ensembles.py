"""Several CEnLMC ensembles at once: ``jax.vmap`` against ``lax.map`` (issue 17, item
6).

A CEnLMC step branches: the gradient buckets (``lax.switch`` over capacities:
only the bucket that holds the particles needing a true gradient runs), the
block-sparse plan's fallback (``lax.cond``) and the audit. Under ``jax.vmap``
a ``cond`` / ``switch`` on a batched predicate becomes a ``select``: every
branch runs for every ensemble, so the largest gradient bucket (all N
particles) is paid at every step, and the block-sparse sums run beside the
dense tiles. ``lax.map`` over the ensembles keeps the branches (one ensemble
after another, each as fast as alone); ``vmap`` pays off only where the step
has no data-dependent branch to lose (e.g. ``dense_grad=True`` with dense tiles).

Measured side by side in one process, the same K ensembles, the same keys:
``jax.jit(jax.vmap(step))``, ``jax.jit(lambda: lax.map(step))`` and K calls of
the jitted single-ensemble step, each timed over ``--repeats`` calls after a
warm-up call, calls alternating; the figure is the median of the per-repeat
ratios to ``lax.map``. The three give the same states (checked).

``python benchmarks/bench_vmap_ensembles.py`` (``--quick``: smaller).
Writes benchmarks/results/vmap_ensembles.{json,md}.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import base_parser, write_results  # noqa: E402

import cenlmc_jax as cj  # noqa: E402


def _states(algo, k, n, d):
    xs = jax.random.normal(jax.random.key(0), (k, n, d))
    states = [algo.init(x) for x in xs]
    return jax.tree.map(lambda *a: jnp.stack(a), *states)


def _time(fn):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def compare(k, n, d, repeats, burn):
    tgt = cj.models.targets.standard_gaussian(d)
    algo = cj.cenlmc(tgt.logdensity_fn, 0.05, 0.3, 0.5, 0.3, 5, 10.0, f_star=tgt.f_star)
    states = _states(algo, k, n, d)
    keys = jax.random.split(jax.random.key(1), k)
    one = jax.jit(algo.step)
    # a few steps first: at the start every particle needs a true gradient (no ensemble
    # yet, all buckets full)
    for _ in range(burn):
        states = jax.tree.map(
            lambda *a: jnp.stack(a),
            *[
                one(keys[i], jax.tree.map(lambda a, i=i: a[i], states))[0]
                for i in range(k)
            ],
        )
    vmapped = jax.jit(jax.vmap(algo.step))
    mapped = jax.jit(lambda ks, ss: lax.map(lambda a: algo.step(*a), (ks, ss)))
    split = [jax.tree.map(lambda a, i=i: a[i], states) for i in range(k)]
    variants = {
        "vmap": lambda: vmapped(keys, states)[0].position,
        "lax.map": lambda: mapped(keys, states)[0].position,
        "one by one": lambda: [one(keys[i], split[i])[0].position for i in range(k)],
    }
    outs = {
        name: np.asarray(jnp.stack(f()) if name == "one by one" else f())
        for name, f in variants.items()
    }
    np.testing.assert_allclose(outs["vmap"], outs["lax.map"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(outs["one by one"], outs["lax.map"], rtol=0, atol=1e-5)
    times = {name: [] for name in variants}
    for r in range(repeats):
        names = list(variants) if r % 2 == 0 else list(reversed(variants))
        for name in names:
            times[name].append(_time(variants[name]))
    fraction = float(jnp.mean(vmapped(keys, states)[1].ensemble_fraction))
    row = dict(K=k, N=n, d=d, ensemble_fraction=round(fraction, 3))
    for name in variants:
        row[f"{name}_ms"] = round(1e3 * statistics.median(times[name]), 1)
    for name in ("vmap", "one by one"):
        ratios = [a / b for a, b in zip(times[name], times["lax.map"], strict=True)]
        row[f"{name}_over_lax.map"] = round(statistics.median(ratios), 2)
    row["times_s"] = {name: [round(t, 4) for t in ts] for name, ts in times.items()}
    return row


def main():
    parser = base_parser(" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--ensembles", type=int, default=4)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 8192])
    parser.add_argument("--d", type=int, default=2)
    parser.add_argument(
        "--burn", type=int, default=20, help="steps before timing (the ensemble forms)"
    )
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.repeats, args.burn = [512], 2, 5
    rows = []
    for n in args.sizes:
        rows.append(compare(args.ensembles, n, args.d, args.repeats, args.burn))
        print({k: v for k, v in rows[-1].items() if k != "times_s"}, flush=True)
    notes = [
        f"CEnLMC on the standard Gaussian (d = {args.d}), K = {args.ensembles} "
        f"ensembles of N particles, one step per call after {args.burn} steps (the "
        "ensemble force in use: ensemble_fraction); jitted, inputs on the device; "
        f"median of {args.repeats} calls, variants alternating; ratios: medians of "
        "per-repeat ratios.",
        "vmap: jax.jit(jax.vmap(step)); lax.map: jax.jit of lax.map(step) over the "
        "ensembles; one by one: K calls of the jitted single-ensemble step. The same "
        "states from all three (checked to 1e-5).",
        "Why vmap is slower: a cond / switch on a batched predicate runs every branch "
        "(the largest gradient bucket, the dense tiles beside the block-sparse sums). "
        "Use lax.map (or a Python loop) over ensembles.",
    ]
    write_results(
        "vmap_ensembles",
        dict(args={k: v for k, v in vars(args).items() if k != "out_dir"}),
        rows,
        out_dir=args.out_dir,
        notes=notes,
        title="Several CEnLMC ensembles: jax.vmap against lax.map",
        command="python benchmarks/bench_vmap_ensembles.py"
        + (" --quick" if args.quick else ""),
    )


if __name__ == "__main__":
    main()
