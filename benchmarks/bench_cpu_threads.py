"""XLA's CPU thread pool: one thread against the default pool (a thread a core), for
the ensemble samplers' steps at several sizes.

Why: on CPU, JAX runs every program on an intra-op pool of one thread per core
(``PJRT_NPROC`` sets its size; it must be set before the backend starts). A small
ensemble's step is many small operations, and dispatching each over the pool costs
more CPU than it saves in wall time. The CLI picks the pool from the job's size
(``cenlmc_jax.cli.cpu_threads``); this measures where one thread stops paying.

Two worker processes, one with ``PJRT_NPROC=1`` and one with the default pool, each
build every configuration once (compiled, warmed); then the parent asks them in turn
for one timed call of each configuration, so the two settings are interleaved through
the machine's drift. A timed call is a jitted ``lax.scan`` of ``max(10, 600000 / N)``
steps. Reported: CPU and wall ms a step (medians) and the medians of the per-repeat
ratios (one thread / default pool), with their ranges.

Target N(0, I_d). CEnLMC at d = 2: the CLI's main job's parameters at N = 2,000
(``eta = R2 = 0.251 sqrt(2000 / N)``, ``R1 = 0.39``, ``N* = 6``, ``M_f = 4.61``,
``h = 0.0316``); LMC at d = 10 and d = 100, ``h = 0.05``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

CONFIGS = [
    ("cenlmc", 2, 500),
    ("cenlmc", 2, 2000),
    ("cenlmc", 2, 8192),
    ("cenlmc", 2, 32768),
    ("lmc", 10, 2000),
    ("lmc", 10, 32768),
    ("lmc", 100, 2000),
    ("lmc", 100, 32768),
]


def _worker() -> None:
    """Build every configuration named on stdin's first line, then time one call per
    request line (``index repeat``), answering a JSON line each."""
    import jax
    import jax.numpy as jnp

    import cenlmc_jax as cj

    jax.config.update("jax_enable_x64", False)

    def logdensity(x):
        return -0.5 * jnp.sum(x**2)

    def build(method, d, n):
        if method == "cenlmc":
            eta = 0.251 * (2000 / n) ** 0.5
            algo = cj.cenlmc(logdensity, 0.0316, eta, 0.39, eta, 6, 4.61)
        else:
            algo = cj.lmc(logdensity, 0.05)
        steps = max(10, 600000 // n)

        @jax.jit
        def run(key, state):
            def body(s, k):
                s, info = algo.step(k, s)
                return s, None

            return jax.lax.scan(body, state, jax.random.split(key, steps))[0]

        state = algo.init(jax.random.normal(jax.random.key(1), (n, d)))
        state = jax.block_until_ready(run(jax.random.key(0), state))
        return run, state, steps

    configs = [build(*c) for c in json.loads(sys.stdin.readline())]
    print("ready", flush=True)
    for line in sys.stdin:
        i, rep = map(int, line.split())
        run, state, steps = configs[i]
        t, c = time.perf_counter(), time.process_time()
        jax.block_until_ready(run(jax.random.key(rep + 1), state))
        wall = (time.perf_counter() - t) / steps * 1e3
        cpu = (time.process_time() - c) / steps * 1e3
        print(json.dumps(dict(wall=wall, cpu=cpu)), flush=True)


def _start(configs, one_thread: bool) -> subprocess.Popen:
    env = dict(os.environ)
    env.pop("PJRT_NPROC", None)
    if one_thread:
        env["PJRT_NPROC"] = "1"
    proc = subprocess.Popen(
        [sys.executable, __file__, "--worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    proc.stdin.write(json.dumps(configs) + "\n")
    proc.stdin.flush()
    if proc.stdout.readline().strip() != "ready":
        raise RuntimeError("a benchmark worker failed to start")
    return proc


def _ask(proc: subprocess.Popen, i: int, rep: int) -> dict:
    proc.stdin.write(f"{i} {rep}\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())


def main():
    from _common import base_parser, write_results

    parser = base_parser(" ".join(__doc__.split("\n\n")[0].split()))
    args = parser.parse_args()
    configs = CONFIGS[:2] if args.quick else CONFIGS
    repeats = 3 if args.quick else args.repeats
    workers = {"one": _start(configs, True), "pool": _start(configs, False)}
    times = {k: [[] for _ in configs] for k in workers}
    for rep in range(repeats):
        for i in range(len(configs)):
            for k, proc in workers.items():
                times[k][i].append(_ask(proc, i, rep))
    for proc in workers.values():
        proc.stdin.close()
        proc.wait()
    rows = []
    for i, (method, d, n) in enumerate(configs):
        one, pool = times["one"][i], times["pool"][i]
        cpu_r = [a["cpu"] / b["cpu"] for a, b in zip(one, pool, strict=True)]
        wall_r = [a["wall"] / b["wall"] for a, b in zip(one, pool, strict=True)]
        rows.append(
            dict(
                method=method,
                d=d,
                n=n,
                cpu_ms_one=statistics.median(t["cpu"] for t in one),
                cpu_ms_pool=statistics.median(t["cpu"] for t in pool),
                wall_ms_one=statistics.median(t["wall"] for t in one),
                wall_ms_pool=statistics.median(t["wall"] for t in pool),
                cpu_ratio=statistics.median(cpu_r),
                cpu_ratio_range=[float(np.min(cpu_r)), float(np.max(cpu_r))],
                wall_ratio=statistics.median(wall_r),
                wall_ratio_range=[float(np.min(wall_r)), float(np.max(wall_r))],
            )
        )
        print(rows[-1], flush=True)
    write_results(
        "cpu_threads",
        dict(repeats=repeats, cores=os.cpu_count()),
        rows,
        columns=[
            "method",
            "d",
            "n",
            "cpu_ms_one",
            "cpu_ms_pool",
            "wall_ms_one",
            "wall_ms_pool",
            "cpu_ratio",
            "cpu_ratio_range",
            "wall_ratio",
            "wall_ratio_range",
        ],
        out_dir=args.out_dir,
        title="XLA's CPU pool: one thread (PJRT_NPROC=1) against a thread a core",
        notes=[
            "ms a step, medians over the interleaved repeats; ratios: one thread / "
            "the default pool, the median of the per-repeat ratios with their range "
            "(below 1: one thread is cheaper).",
            "Each setting is its own worker process (the pool's size is fixed when "
            "the backend starts); the parent alternates between them.",
        ],
    )


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        _worker()
    else:
        main()
