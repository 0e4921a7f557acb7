"""Compile time of AutoStep HMC's sampling program against HMC's (issue 48), on the
103-d stochastic-volatility model of benchmarks/big_models/sv.py.

The program is what ``cj.sample`` compiles for a vmapped sampler: a ``lax.scan`` of
moves of 128 chains. Each measurement is a fresh Python process (nothing cached),
``jax.jit(run).lower(...)`` then ``.compile()``, timed apart; ``--code DIR`` runs the
package of another checkout (a git worktree at an older commit) in the same
alternation, so a change is measured side by side. The first move's positions are
printed too: the same numbers before and after a change that should not move the
draws.

Run: ``python benchmarks/bench_autostep_compile.py --repeats 3 --code WORKTREE``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import write_results  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = r"""
import importlib.util, json, sys, time
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
import cenlmc_jax as cj
spec = importlib.util.spec_from_file_location("sv", sys.argv[1])
sv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sv)
which, chains, moves = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
M = np.linspace(0.5, 1.5, sv.DIM)
make = cj.autostep_hmc if which == "autostep" else cj.hmc
alg = cj.vmap_chains(make(sv.logp, 0.2, 6, inverse_mass_matrix=M))
st = alg.init(0.1 * jax.random.normal(jax.random.key(0), (chains, sv.DIM)))

def run(key, st):
    def body(s, k):
        s, i = alg.step(k, s)
        return s, i.is_accepted
    return jax.lax.scan(body, st, jax.random.split(key, moves))

t0 = time.perf_counter()
low = jax.jit(run).lower(jax.random.key(1), st)
t1 = time.perf_counter()
comp = low.compile()
t2 = time.perf_counter()
out = comp(jax.random.key(1), st)
print(json.dumps(dict(lower_s=t1 - t0, compile_s=t2 - t1,
                      check=float(jnp.sum(out[0].position)))))
"""


def measure(which: str, code: str | None, chains: int, moves: int) -> dict:
    env = dict(os.environ)
    if code:
        env["PYTHONPATH"] = code + os.pathsep + env.get("PYTHONPATH", "")
    model = os.path.join(HERE, "big_models", "sv.py")
    out = subprocess.run(
        [sys.executable, "-c", CHILD, model, which, str(chains), str(moves)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=os.path.dirname(HERE) if not code else code,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--chains", type=int, default=128)
    ap.add_argument("--moves", type=int, default=5)
    ap.add_argument("--code", default=None, help="a baseline checkout, alternated")
    ap.add_argument("--code-label", default="baseline")
    ap.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    variants = [("this checkout", None)]
    if args.code:
        variants.append((args.code_label, args.code))
    raw = []
    for rep in range(args.repeats):
        for label, code in variants:
            for which in ("hmc", "autostep"):
                r = measure(which, code, args.chains, args.moves)
                raw.append(dict(repeat=rep, code=label, sampler=which, **r))
                print(json.dumps(raw[-1]), flush=True)
    rows = []
    for label, _ in variants:
        for which in ("hmc", "autostep"):
            rs = [r for r in raw if r["code"] == label and r["sampler"] == which]
            rows.append(
                dict(
                    code=label,
                    sampler=which,
                    compile_s_median=round(
                        statistics.median(r["compile_s"] for r in rs), 3
                    ),
                    compile_s_all=", ".join(f"{r['compile_s']:.2f}" for r in rs),
                    lower_s_median=round(
                        statistics.median(r["lower_s"] for r in rs), 3
                    ),
                    check=rs[0]["check"],
                )
            )
    write_results(
        "autostep_compile",
        dict(raw=raw),
        rows,
        out_dir=args.out_dir,
        title="Compile time of AutoStep HMC's vmapped program against HMC's "
        "(103-d SV model)",
        notes=[
            f"{args.chains} chains, a lax.scan of {args.moves} moves, float64, L = 6, "
            "a diagonal M; each value a fresh process, the variants alternated "
            f"{args.repeats} times (compile_s_all in run order). check: the sum of "
            "the positions after the scan (the same draws give the same number).",
        ],
    )


if __name__ == "__main__":
    main()
