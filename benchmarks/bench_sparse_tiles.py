"""Block-sparse tile sizes of the CEnLMC pair force at d = 2: 64-row tiles (128 tile
pairs a step) against 32-row tiles (256 a step), one CEnLMC step timed.

Why: ``pairwise.tiled.SPARSE_SMALL_N`` halves the default row tiles up to 4,096
particles (the CLI's main job has 2,000). This measures both settings side by side,
interleaved in one process (each its own compiled program, selected by
``block_size``), as CPU-time ratios with repeats: the machine is shared and noisy.

Target N(0, I_2); radii ``eta = R2 = 0.251 sqrt(2000 / N)`` (the CLI's at N = 2,000,
shrunk so the neighbour counts stay the same), ``R1 = 0.39``, ``N* = 6``,
``M_f = 4.61``, ``h = 0.0316``. A timed call is a ``lax.scan`` of
``max(10, 600000 / N)`` steps from a relaxed ensemble.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import cenlmc_jax as cj


def logdensity(x):
    return -0.5 * jnp.sum(x**2)


def runner(n: int, rows: int):
    eta = 0.251 * (2000 / n) ** 0.5
    algo = cj.cenlmc(logdensity, 0.0316, eta, 0.39, eta, 6, 4.61, block_size=rows)
    steps = max(10, 600000 // n)

    @jax.jit
    def run(key, state):
        def body(s, k):
            s, info = algo.step(k, s)
            return s, info.grad_evals

        return jax.lax.scan(body, state, jax.random.split(key, steps))

    state = algo.init(jax.random.normal(jax.random.key(1), (n, 2)))
    state = jax.block_until_ready(run(jax.random.key(0), state)[0])
    return run, state, steps


def main():
    from _common import base_parser, write_results

    parser = base_parser(" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[2000, 4096, 8192, 65536]
    )
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.repeats = [1000], 3
    rows = []
    for n in args.sizes:
        configs = {r: runner(n, r) for r in (64, 32)}
        cpu = {r: [] for r in configs}
        wall = {r: [] for r in configs}
        for rep in range(args.repeats):
            for r, (run, state, steps) in configs.items():
                t, c = time.perf_counter(), time.process_time()
                jax.block_until_ready(run(jax.random.key(rep + 1), state))
                wall[r].append((time.perf_counter() - t) / steps * 1e3)
                cpu[r].append((time.process_time() - c) / steps * 1e3)
        ratios = [a / b for a, b in zip(cpu[32], cpu[64], strict=True)]
        rows.append(
            dict(
                n=n,
                cpu_ms_64=statistics.median(cpu[64]),
                cpu_ms_32=statistics.median(cpu[32]),
                wall_ms_64=statistics.median(wall[64]),
                wall_ms_32=statistics.median(wall[32]),
                cpu_ratio_32_over_64=statistics.median(ratios),
                ratio_range=[float(np.min(ratios)), float(np.max(ratios))],
                default_rows=32 if n <= cj.pairwise.tiled.SPARSE_SMALL_N else 64,
            )
        )
        print(rows[-1], flush=True)
    write_results(
        "sparse_tiles",
        dict(repeats=args.repeats),
        rows,
        columns=[
            "n",
            "cpu_ms_64",
            "cpu_ms_32",
            "wall_ms_64",
            "wall_ms_32",
            "cpu_ratio_32_over_64",
            "ratio_range",
            "default_rows",
        ],
        out_dir=args.out_dir,
        title="Block-sparse tiles at d = 2: 64-row against 32-row tiles, one CEnLMC "
        "step",
        notes=[
            "CPU and wall ms a step (medians over the interleaved repeats); the ratio "
            "is the median of the per-repeat CPU ratios (32-row / 64-row), with its "
            "range.",
            "default_rows: what sparse_tiles picks at this N (32 up to "
            "SPARSE_SMALL_N = 4096 particles).",
        ],
    )


if __name__ == "__main__":
    main()
