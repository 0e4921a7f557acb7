"""AutoStep HMC against HMC at the same tuned step, from the same hand-over.

``cj.langevin_warmup`` (2,000 chains from uniform(-2, 2), defaults) hands over AutoStep
HMC (``cj.autostep_hmc``) where its adjusted phase finds particles that a fixed step
cannot move (issue 46: a banana's arms, a funnel's neck). This script measures what
that buys: from the same warm-up state, with the same ``ε``, ``L``, ``M`` and jitter,
``--moves`` moves of

* ``hmc``: ``cj.hmc`` (one step for the whole posterior), and
* ``autostep``: ``cj.autostep_hmc`` (the step halved where the first leapfrog step's
  energy error says so, with its reverse check),

and the ensemble's sd of each case's slow coordinate (a banana's x1, a funnel's v,
centred eight schools' log τ) over each quarter of the run against its reference
(``bench_many_chains.REFS``): how far the chains fill the region. Beside it: the
divergence rate, gradients a move per chain (mean) and in lockstep (the slowest chain
of each move, what a vmapped run waits for), and wall time (both variants in one
process, one after the other, each compiled first: ``wall_s`` excludes compiling).

    python benchmarks/bench_autostep.py [--moves 800] [--seeds 0] [--cases ...]

Writes ``results/autostep.{json,md}``; about 4 minutes on 2 CPU cores at the defaults
(``--quick``: 100 moves, the banana only).
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from _common import base_parser, write_results

jax.config.update("jax_enable_x64", True)

import cenlmc_jax as cj  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "many_chains_models"))
from bench_many_chains import REFS  # noqa: E402

#: case -> the coordinate whose sd says how far the chains reached
SCALE = {"banana": "x[1]", "funnel": "x[0]", "eight_schools_centered": "x[1]"}
CHAINS = 2000


def _sd(m1, m2):
    """The sd over moves from the per-move ensemble means of x and x²."""
    return float(np.sqrt(np.mean(m2) - np.mean(m1) ** 2))


def _per_move(a):
    a = np.asarray(a, np.float64)
    return a.reshape(a.shape[0], -1)


def run_variant(kind, res, logp, i, moves, key):
    p = res.parameters
    kw = dict(
        inverse_mass_matrix=p["inverse_mass_matrix"], step_jitter=p["step_jitter"]
    )
    make = cj.autostep_hmc if kind == "autostep" else cj.hmc
    algo = cj.vmap_chains(make(logp, p["step_size"], p["num_integration_steps"], **kw))

    def go(n):
        return cj.sample(
            key,
            algo,
            res.state,
            n,
            trace_fn=lambda s: (
                jnp.mean(s.position[:, i]),
                jnp.mean(s.position[:, i] ** 2),
            ),
            info_reduce=None,
            check_convergence=False,
        )

    go(2)  # compiles the step (the run below reuses it)
    t0 = time.perf_counter()
    out = go(moves)
    jax.block_until_ready(out.trace)
    wall = time.perf_counter() - t0
    m1, m2 = (np.asarray(a, np.float64) for a in out.trace)
    q = moves // 4
    quarters = [_sd(m1[k * q : (k + 1) * q], m2[k * q : (k + 1) * q]) for k in range(4)]
    grads = _per_move(out.info.grad_evals)
    return dict(
        sd_quarters=quarters,
        sd_second_half=_sd(m1[moves // 2 :], m2[moves // 2 :]),
        divergent_rate=float(np.mean(_per_move(out.info.divergent))),
        acceptance=float(np.mean(_per_move(out.info.acceptance_rate))),
        grads_per_move=float(grads.mean()),
        lockstep_grads_per_move=float(grads.max(1).mean()),
        halved=(
            float(np.mean(_per_move(out.info.halved))) if kind == "autostep" else None
        ),
        wall_s=wall,
    )


def run_case(case, seed, moves):
    d, refs = REFS[case]
    logp = importlib.import_module(case).logp
    x0 = jax.random.uniform(jax.random.key(1 + seed), (CHAINS, d), minval=-2, maxval=2)
    res = cj.langevin_warmup(jax.random.key(seed), logp, x0)
    coord = SCALE[case]
    i = int(coord[2:-1])
    name, _, ref_sd = refs[coord]
    rows = []
    for kind in ("hmc", "autostep"):
        r = run_variant(kind, res, logp, i, moves, jax.random.key(7 + seed))
        rows.append(
            dict(
                case=case,
                seed=seed,
                kernel=kind,
                handed_over=res.parameters.get("autostep"),
                coordinate=f"{coord} ({name})",
                reference_sd=ref_sd,
                step_size=float(res.parameters["step_size"]),
                num_integration_steps=int(res.parameters["num_integration_steps"]),
                moves=moves,
                **r,
            )
        )
        print(rows[-1], flush=True)
    return rows


def main():
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--moves", type=int, default=800)
    parser.add_argument("--cases", default=",".join(SCALE))
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    moves = 100 if args.quick else args.moves
    cases = ["banana"] if args.quick else args.cases.split(",")
    rows = [r for c in cases for s in seeds for r in run_case(c, s, moves)]
    md = [
        {
            **r,
            "sd_quarters": ", ".join(f"{v:.3f}" for v in r["sd_quarters"]),
            "sd_second_half": f"{r['sd_second_half']:.3f} ({r['sd_second_half'] / r['reference_sd'] - 1:+.1%})",  # noqa: E501
            "reference_sd": f"{r['reference_sd']:.4g}",
            "divergent_rate": f"{r['divergent_rate']:.2%}",
            "acceptance": f"{r['acceptance']:.2f}",
            "grads_per_move": f"{r['grads_per_move']:.1f}",
            "lockstep_grads_per_move": f"{r['lockstep_grads_per_move']:.1f}",
            "halved": "-" if r["halved"] is None else f"{r['halved']:.1%}",
            "wall_s": f"{r['wall_s']:.1f}",
        }
        for r in rows
    ]
    write_results(
        "autostep",
        dict(chains=CHAINS, seeds=seeds, moves=moves),
        rows,
        md_rows=md,
        columns=[
            "case",
            "seed",
            "kernel",
            "coordinate",
            "reference_sd",
            "sd_quarters",
            "sd_second_half",
            "divergent_rate",
            "acceptance",
            "halved",
            "grads_per_move",
            "lockstep_grads_per_move",
            "wall_s",
        ],  # fmt: skip
        out_dir=args.out_dir,
        title="AutoStep HMC against HMC at the same step, from the same hand-over",
        notes=[
            f"{CHAINS} chains from uniform(-2, 2), cj.langevin_warmup (defaults; key = "
            "seed), then from its state and with its step_size, num_integration_steps, "
            f"inverse_mass_matrix and step_jitter, {moves} moves of each kernel (key 7 "
            "+ seed, the same for both).",
            "sd_quarters: the ensemble's sd of the coordinate over each quarter of the "
            "moves; sd_second_half: over the second half, and its error against the "
            "reference (exact for the banana and the funnel; quadrature for eight "
            "schools).",
            "grads_per_move: gradients a move per chain, mean; lockstep: the slowest "
            "chain's each move, averaged (a vmapped move waits for it). halved: the "
            "share of AutoStep moves that halved their step. wall_s: the moves alone "
            "(compiled before), 2 CPU cores.",
        ],
    )


if __name__ == "__main__":
    main()
