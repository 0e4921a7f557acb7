"""What raising CEnLMC's ensemble fraction costs in accuracy, measured.

The R1 test (``|x_i - w_i| = sqrt(2h)|ξ_i| <= R1``) caps the ensemble
fraction near its pass probability p: ``R1 = sqrt(2h χ²_d.ppf(p))``, and the
suggestion's p = 0.7 gives about 0.63 on the 2-D Gaussian. Raising p lets
particles with larger noise draws use the ensemble force: their neighbours'
weights ``1/p_j`` are larger and noisier (Lemma 4.2's ``exp((η+R1+R2)²/4h)``).
For each p this runs CEnLMC on N(0, I_2) (h = 0.05, η = R2 = 0.316, the
suggested values) with the default gradient audit (8 particles a step), and
reports the ensemble fraction, gradients saved against LMC, the audit's median
drift error in noise lengths, its variance-inflation estimate (mean of
``info.audit_variance_inflation`` over the kept steps) and bias flag, and the
error of the stationary variance against ULA's exact ``1/(1 - h/2)`` with its
MCSE (over the N independent per-particle averages): the relative error
should match the inflation estimate (module docstring of ``cenlmc_jax.ensemble``),
and the flag should fire where it exceeds 0.06.

Run: ``python benchmarks/bench_fraction.py`` (``--quick``: N = 500, 300 steps).
"""

from __future__ import annotations

import math
import sys
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import base_parser, write_results  # noqa: E402

import cenlmc_jax as cj  # noqa: E402


def main() -> int:
    parser = base_parser(" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument(
        "--passes", type=float, nargs="+", default=[0.7, 0.8, 0.9, 0.95, 0.99]
    )
    args = parser.parse_args()
    n, steps, burn_in = (500, 300, 50) if args.quick else (2000, 2000, 200)
    h, d = 0.05, 2
    tgt = cj.models.targets.standard_gaussian(d)
    base = cj.ensemble.tuning.suggest_cenlmc_params(d, h, num_particles=n)
    x0 = tgt.sample(jax.random.key(0), n)
    ula = 1.0 / (1.0 - h / 2)
    rows = []
    for p in args.passes:
        r1 = math.sqrt(2 * h * cj.ensemble.tuning.chi2_ppf(p, d))
        algo = cj.cenlmc(
            tgt.logdensity_fn,
            h,
            base.eta,
            r1,
            base.r2,
            base.n_star,
            base.m_f,
            f_star=tgt.f_star,
        )
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter(
                "ignore", RuntimeWarning
            )  # the bias flag is reported in the table
            res = cj.sample(
                jax.random.key(1),
                algo,
                algo.init(x0),
                steps,
                burn_in=burn_in,
                trace_fn=lambda s: jnp.mean(s.position**2, axis=-1),
                on_divergence="warn",
            )
        wall = time.perf_counter() - t0
        per = np.asarray(res.trace, np.float64).mean(axis=0)
        var, se = per.mean(), per.std(ddof=1) / math.sqrt(n)
        info = res.info
        frac = float(np.mean(info.ensemble_fraction[burn_in:]))
        rows.append(
            dict(
                r1_pass=p,
                r1=round(r1, 4),
                ensemble_fraction=round(frac, 3),
                grad_saving=round(1.0 / max(1e-9, 1.0 - frac), 2),
                audit_noise_error=round(
                    float(np.nanmedian(np.asarray(info.audit_noise_error[burn_in:]))), 4
                ),
                audit_drift_ratio=round(
                    float(np.nanmedian(np.asarray(info.audit_drift_ratio[burn_in:]))), 3
                ),
                audit_variance_inflation=round(
                    float(
                        np.nanmean(np.asarray(info.audit_variance_inflation[burn_in:]))
                    ),
                    4,
                ),
                variance=round(var, 4),
                variance_error_vs_ula=round(var - ula, 4),
                mcse=round(se, 4),
                relative_variance_error=round(var / ula - 1, 4),
                audit_biased=bool(np.any(info.biased[burn_in:])),
                z=round((var - ula) / se, 1),
                diverged_at=res.diverged_at,
                wall_s=round(wall, 1),
            )
        )
        print(rows[-1], flush=True)
    write_results(
        "fraction",
        dict(
            args={k: str(v) for k, v in vars(args).items()},
            n=n,
            steps=steps,
            h=h,
            ula_variance=ula,
        ),
        rows,
        out_dir=args.out_dir,
        title="CEnLMC: ensemble fraction against accuracy (2-D Gaussian)",
        notes=[
            f"N = {n}, h = {h}, {steps} steps after {burn_in} burn-in, eta = R2 = "
            f"{base.eta:.3f}, N* = {base.n_star}, M_f = {base.m_f:.2f}; ULA's exact "
            f"variance {ula:.4f}.",
            "grad_saving: 1 / (1 - fraction), gradients of LMC per gradient of CEnLMC.",
            "audit_noise_error: median drift error per step in Langevin noise lengths "
            "sqrt(2hd).",
            "audit_variance_inflation: the audit's estimate of the relative variance "
            "inflation by the ensemble noise (mean over kept steps); compare "
            "relative_variance_error = variance / ULA's - 1. audit_biased: info.biased "
            "on a kept step (running estimate > 0.06).",
        ],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
