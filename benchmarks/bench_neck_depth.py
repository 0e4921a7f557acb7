"""Where HMC's divergent trajectories start (``neck_depth``), and where AutoStep HMC
halves its step (``halved_depth``), on the many-chain cases.

``cenlmc_jax.irreversible.hmc.neck_depth`` (the verdict's funnel-neck check, issue 46)
is the mean over the divergent moves of the start's log density, in standard
deviations of the ensemble's log density above its mean. This script measures it
where the CLI's default would: 2,000 chains from uniform(-2, 2) starts,
``cj.langevin_warmup`` with its defaults, then ``--moves`` moves of the handed-over HMC
(``cj.sample``, infos averaged over the chains as the CLI keeps them), on the models of
``benchmarks/many_chains_models`` (the references: ``bench_many_chains.REFS``), and
Neal's funnel at d = 5 and 2 too (a neck of few dimensions is only a little denser
than the funnel's mouth). Beside it: the divergence rate, the lower bound the verdict
judges (``neck_depth_lower``: the depth less ``NECK_Z`` batch-mean standard errors),
the flag (that bound above ``NECK_DEPTH``; ``flagged_point``: the point estimate
above it, the rule before session 58) and the ensemble's estimate of each model's
scale coordinate against its reference (how far the chains filled a neck).

    python benchmarks/bench_neck_depth.py [--seeds 0,1] [--moves 300] [--cases ...]

Writes ``results/neck_depth.{json,md}``. About 3 minutes on 2 CPU cores.
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
from cenlmc_jax.irreversible.autostep import halved_depth  # noqa: E402
from cenlmc_jax.irreversible.hmc import (  # noqa: E402
    NECK_DEPTH,
    NECK_Z,
    neck_depth,
    neck_depth_lower,
)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "many_chains_models"))
from bench_many_chains import REFS  # noqa: E402

#: case -> the coordinate whose sd says how far the chains reached (a scale parameter;
#: for the banana, x1, the arms' height)
SCALE = {
    "banana": "x[1]",
    "eight_schools_centered": "x[1]",
    "eight_schools_noncentered": "x[1]",
    "brownian_missing": "x[31]",
    "funnel": "x[0]",
    "lotka_volterra": "x[0]",
    "brownian_fixed": "x[15]",
    "funnel_d5": "x[0]",
    "funnel_d2": "x[0]",
}
#: cases that are another dimension of a model file: case -> (module, d)
OTHER_DIM = {"funnel_d5": ("funnel", 5), "funnel_d2": ("funnel", 2)}
CHAINS = 2000


def run_case(case, seed, moves):
    module, d = OTHER_DIM.get(case, (case, None))
    d_file, refs = REFS[module]
    d = d or d_file  # funnel.py takes any d >= 2 (v's sd is 3 whatever d)
    logp = importlib.import_module(module).logp
    x0 = jax.random.uniform(
        jax.random.key(1 + seed), (CHAINS, d), minval=-2.0, maxval=2.0
    )
    t0 = time.perf_counter()
    res = cj.langevin_warmup(jax.random.key(seed), logp, x0)
    coord = SCALE[case]
    i = int(coord[2:-1])
    out = cj.sample(
        jax.random.key(7 + seed),
        res.algorithm,
        res.state,
        moves,
        trace_fn=lambda s: (
            jnp.mean(s.position[:, i]),
            jnp.mean(s.position[:, i] ** 2),
        ),
        check_convergence=False,
    )
    m1, m2 = (np.asarray(a, np.float64) for a in out.trace)
    sd = float(np.sqrt(np.mean(m2) - np.mean(m1) ** 2))
    name, _, ref_sd = refs[coord]
    depth, lower = neck_depth(out.info), neck_depth_lower(out.info)
    autostep = hasattr(out.info, "halved")
    halved = halved_depth(out.info) if autostep else None
    halved_lower = (
        neck_depth_lower(out.info, "halved", "halved_logdensity") if autostep else None
    )

    def above(v):
        return v is not None and v > NECK_DEPTH

    return dict(
        case=case,
        seed=seed,
        moves=moves,
        divergent_rate=float(np.mean(np.asarray(out.info.divergent))),
        neck_depth=depth,
        neck_lower=lower,
        flagged=above(lower) or above(halved_lower),
        flagged_point=above(depth) or above(halved),
        kernel="AutoStep HMC" if autostep else "HMC",
        halved_rate=float(np.mean(np.asarray(out.info.halved))) if autostep else None,
        halved_depth=halved,
        halved_lower=halved_lower,
        coordinate=f"{coord} ({name})",
        sd=sd,
        reference_sd=ref_sd,
        sd_error=sd / ref_sd - 1.0,
        step_size=float(res.info.step_size),
        wall_s=time.perf_counter() - t0,
    )


def main():
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--moves", type=int, default=300)
    parser.add_argument("--cases", default=",".join(SCALE))
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    moves = 50 if args.quick else args.moves
    rows = []
    for case in args.cases.split(","):
        for seed in seeds[:1] if args.quick else seeds:
            r = run_case(case, seed, moves)
            print(r, flush=True)
            rows.append(r)
    md = [
        {
            **r,
            "divergent_rate": f"{r['divergent_rate']:.2%}",
            "neck_depth": "-" if r["neck_depth"] is None else f"{r['neck_depth']:+.2f}",
            "neck_lower": "-" if r["neck_lower"] is None else f"{r['neck_lower']:+.2f}",
            "halved_lower": "-"
            if r["halved_lower"] is None
            else f"{r['halved_lower']:+.2f}",
            "halved_rate": "-"
            if r["halved_rate"] is None
            else f"{r['halved_rate']:.1%}",
            "halved_depth": "-"
            if r["halved_depth"] is None
            else f"{r['halved_depth']:+.2f}",
            "sd": f"{r['sd']:.4g}",
            "sd_error": f"{r['sd_error']:+.1%}",
            "wall_s": f"{r['wall_s']:.1f}",
        }
        for r in rows
    ]
    write_results(
        "neck_depth",
        dict(chains=CHAINS, threshold=NECK_DEPTH, seeds=seeds, moves=moves),
        rows,
        md_rows=md,
        columns=[
            "case",
            "seed",
            "kernel",
            "divergent_rate",
            "neck_depth",
            "neck_lower",
            "halved_rate",
            "halved_depth",
            "halved_lower",
            "flagged",
            "flagged_point",
            "coordinate",
            "sd",
            "reference_sd",
            "sd_error",
            "wall_s",
        ],  # fmt: skip
        out_dir=args.out_dir,
        title="Where HMC's divergent trajectories start (neck_depth, issue 46)",
        notes=[
            f"{CHAINS} chains from uniform(-2, 2), cj.langevin_warmup (defaults), then "
            f"{moves} moves of its HMC (cj.sample, infos averaged over chains, as the "
            "CLI keeps them); warm-up key = seed, sampling key = 7 + seed.",
            "neck_depth: the mean over the divergent moves of the start's log density, "
            "in standard deviations of the ensemble's log density above its mean "
            "('-': fewer than 0.05 % of the moves diverged). neck_lower: the depth "
            f"less {NECK_Z:g} of its standard errors (batch means over 16 runs of "
            "consecutive moves; hmc.neck_depth_lower), what the verdict judges. "
            f"flagged: neck_lower above {NECK_DEPTH} (the verdict fails the run); "
            "flagged_point: the point estimate above it (the rule before session "
            "58).",
            "kernel: what the warm-up handed over (AutoStep HMC where at least 1 % of "
            "the particles were stuck at the tuned step). halved_rate, halved_depth: "
            "AutoStep's moves that halved their step, and the mean of their starts' "
            "log density in the same units (autostep.halved_depth; '-': HMC, or fewer "
            "than 0.05 % halved), halved_lower its lower bound as neck_lower's. "
            f"flagged: neck_lower or halved_lower above {NECK_DEPTH} (the verdict "
            "fails the run on either).",
            "sd: the ensemble's sd of the coordinate over the moves, against the "
            "reference sd (bench_many_chains.REFS): how far the chains filled a neck "
            "(a scale parameter's sd is low where they did not).",
        ],
    )


if __name__ == "__main__":
    main()
