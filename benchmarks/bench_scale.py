"""Speed and scale of the ensemble force and of a full CEnLMC step (issue 5).

One run measures, side by side:

* the machine's float32 SGEMM rate (``jnp.dot``, 4096², HIGHEST), and for the
  row-tiled kernel (and the Pallas kernel where there is a GPU) at
  N = 10^3 .. 10^6, d = 2, 10, 100: pairs/s, compiled temporary memory and the
  fraction of the SGEMM rate reached (matmul flops 4d+2 per pair). A size whose
  projected time exceeds ``--max-call-s`` is listed as skipped (on a 2-core CPU
  N = 10^6 would take ~20 min per call);
* mask decisions against float64: per-particle ball counts of the float32
  kernel vs the float64 oracle, on centred data and on data offset by 100
  (the kernel centres internally, so both should agree), as the fraction of
  pairs whose decision must differ (|Δ count| summed / N²: a lower bound on
  flipped decisions);
* a full ``cenlmc_step`` (standard Gaussian, d = 10, parameters from
  ``tuning.suggest_cenlmc_params``, three steps in): time per particle and
  compiled temporary memory at N = 10^4 and 10^5.

``python benchmarks/bench_scale.py`` (add ``--quick`` for a smoke run).
Writes benchmarks/results/scale.{json,md}.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import (
    base_parser,
    compiled_memory,
    fmt_bytes,
    sgemm_rate,
    time_call,
    write_results,
)  # noqa: E402
from bench_pairwise import make_ensemble  # noqa: E402

import cenlmc_jax as cj  # noqa: E402
from cenlmc_jax.pairwise import ensemble_force, ensemble_force_reference_numpy  # noqa: E402


def kernel_rows(args, sgemm):
    rows = []
    methods = ["tiled"] + (["pallas"] if jax.default_backend() == "gpu" else [])
    rate_guess = {}  # pairs/s measured at the previous N, to project the next
    for d in args.dims:
        for n in args.sizes:
            for method in methods:
                pairs = float(n) * n
                guess = rate_guess.get((method, d))
                if guess is not None and pairs / guess > args.max_call_s:
                    rows.append(
                        dict(
                            kernel=method,
                            N=n,
                            d=d,
                            note=f"skipped: projected {pairs / guess:.0f} s per call",
                        )
                    )
                    continue
                x, f, log_p, _, eta = make_ensemble(n, d)
                fn = jax.jit(functools.partial(ensemble_force, eta=eta, method=method))
                mem = compiled_memory(fn, x, f, log_p)
                t = time_call(fn, x, f, log_p, repeats=args.repeats)
                rate = pairs / t.median_s
                rate_guess[(method, d)] = rate
                flops = (4 * d + 2) * pairs / t.median_s
                rows.append(
                    dict(
                        kernel=method,
                        N=n,
                        d=d,
                        ms=round(t.median_s * 1e3, 3),
                        pairs_per_s=f"{rate:.3g}",
                        temp=fmt_bytes(mem["temp_bytes"]),
                        temp_bytes=mem["temp_bytes"],
                        frac_sgemm=f"{flops / sgemm['flops_per_s']:.0%}",
                        note="",
                    )
                )
    return rows


def mask_rows(args):
    rows = []
    n, d = args.mask_n, 10
    for label, offset in (("centred", 0.0), ("offset +100", 100.0)):
        x, f, log_p, _, eta = make_ensemble(n, d, seed=3)
        x = x + offset
        res = ensemble_force(x, f, log_p, eta, method="tiled")
        ref = ensemble_force_reference_numpy(
            np.asarray(x, np.float64),
            np.asarray(f, np.float64),
            np.asarray(log_p, np.float64),
            eta,
        )
        diff = np.abs(
            np.asarray(res.n_ball, np.int64) - np.asarray(ref.n_ball, np.int64)
        )
        scale = np.max(np.abs(ref.force_sum), axis=1) + 1e-30
        rel = (
            np.max(
                np.abs(np.asarray(res.force_sum, np.float64) - ref.force_sum), axis=1
            )
            / scale
        )
        rows.append(
            dict(
                data=label,
                N=n,
                d=d,
                pairs=n * n,
                count_differences=int(diff.sum()),
                flip_fraction_lower_bound=f"{diff.sum() / (n * n):.2e}",
                median_rel_force_error=f"{np.median(rel):.1e}",
            )
        )
    return rows


def cenlmc_rows(args):
    rows = []
    d, h = 10, 0.05
    tgt = cj.models.targets.standard_gaussian(d)
    for n in args.step_sizes:
        prm = cj.ensemble.tuning.suggest_cenlmc_params(d, h, num_particles=n)
        x0 = jax.random.normal(jax.random.key(0), (n, d))
        state = cj.ensemble.cenlmc_init(x0, tgt.logdensity_fn, f_star=tgt.f_star)
        step = jax.jit(
            functools.partial(
                cj.ensemble.cenlmc_step,
                logdensity_fn=tgt.logdensity_fn,
                step_size=h,
                eta=prm.eta,
                r1=prm.r1,
                r2=prm.r2,
                n_star=prm.n_star,
                m_f=prm.m_f,
            )
        )
        for t in range(3):  # past the w = +inf start: the ensemble path is live
            state, _ = step(jax.random.key(10 + t), state)
        mem = compiled_memory(step, jax.random.key(2), state)
        t = time_call(
            step, jax.random.key(2), state, repeats=args.repeats if n <= 20_000 else 2
        )
        _, info = step(jax.random.key(2), state)
        rows.append(
            dict(
                N=n,
                d=d,
                ms_per_step=round(t.median_s * 1e3, 2),
                us_per_particle=round(t.median_s / n * 1e6, 3),
                temp=fmt_bytes(mem["temp_bytes"]),
                temp_bytes=mem["temp_bytes"],
                ensemble_fraction=round(float(info.ensemble_fraction), 3),
                grad_evals=int(info.grad_evals),
                params=dict(
                    eta=prm.eta, r1=prm.r1, r2=prm.r2, n_star=prm.n_star, m_f=prm.m_f
                ),
            )
        )
    return rows


def main():
    p = base_parser(" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=[1000, 4096, 16384, 65536, 262144, 1_000_000],
    )
    p.add_argument("--dims", type=int, nargs="+", default=[2, 10, 100])
    p.add_argument(
        "--max-call-s",
        type=float,
        default=20.0,
        help="skip sizes projected to take longer per call",
    )
    p.add_argument("--mask-n", type=int, default=4096)
    p.add_argument("--step-sizes", type=int, nargs="+", default=[10_000, 100_000])
    args = p.parse_args()
    if args.quick:
        args.sizes, args.dims, args.mask_n, args.step_sizes, args.repeats = (
            [1000, 4096],
            [2, 10],
            1024,
            [10_000],
            2,
        )
    sgemm = sgemm_rate(repeats=args.repeats)
    kr, mr, cr = kernel_rows(args, sgemm), mask_rows(args), cenlmc_rows(args)
    notes = [
        f"float32 SGEMM (4096², HIGHEST): {sgemm['flops_per_s'] / 1e9:.1f} GFLOP/s, "
        "measured in this run."
    ]
    notes += [
        f"mask check: {r['data']}, N={r['N']}, d={r['d']}: count differences "
        f"{r['count_differences']} (flip fraction >= "
        f"{r['flip_fraction_lower_bound']}), median relative force error "
        f"{r['median_rel_force_error']}"
        for r in mr
    ]
    notes += [
        f"cenlmc_step N={r['N']}, d={r['d']}: {r['ms_per_step']} ms/step, "
        f"{r['us_per_particle']} us/particle, temp {r['temp']}, ensemble fraction "
        f"{r['ensemble_fraction']}"
        for r in cr
    ]
    write_results(
        "scale",
        {"sgemm": sgemm, "mask": mr, "cenlmc_step": cr},
        kr,
        columns=["kernel", "N", "d", "ms", "pairs_per_s", "temp", "frac_sgemm", "note"],
        title="Ensemble force and CEnLMC step at scale",
        notes=notes,
        out_dir=args.out_dir,
    )


if __name__ == "__main__":
    main()
