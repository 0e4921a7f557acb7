"""The local least-squares ensemble gradient against the paper's importance-weighted
estimate, at equal η.

Both estimate ``∇f`` at a particle from its neighbours in the η-ball of an
ensemble drawn from the target ``π ∝ exp(-f)`` (here Gaussians, 2-D and 3-D,
correlated, ``∇f(x) = Σ⁻¹ x``):

* ``paper``: eq. 3.19-3.21 with the sampling density as the proposal, ``F_i = 1/(N-1)
  Σ_j α_d (f_j - f_i)/|x_j - x_i|² 1[|x_j - x_i| ≤ η] / π(x_j) (x_j - x_i)``
  (``cenlmc_jax.pairwise.ensemble_force`` with ``log_p = log π``, no w); a particle
  "accepts" it when its ball is not empty (the library's guard, ``min_ball_neighbours =
  1``; the R1 / R2 / N* tests need a chain and are not part of this static comparison);
* ``ls`` / ``ls-uniform``:
  :func:`cenlmc_jax.ensemble.least_squares.least_squares_gradient`, the linear fit with
  the Epanechnikov / uniform kernel; accepted when its conditioning test passes (default
  floor 0.05);
* ``ls-quadratic``: with the quadratic term (exact on a Gaussian, so its error
  is rounding: shown only for its acceptance fraction).

Bias and variance are conditional on the particle: ``P`` probe particles are
drawn once and kept; ``R`` times the other ``N - P`` particles are redrawn,
and each estimator is evaluated at the probes. Per probe, ``bias_i`` is the
mean error over the reps that accepted, ``var_i`` the variance; reported:
``bias² = mean_i (|bias_i|² - var_i/k_i)`` (unbiased over ``k_i`` accepting reps),
``var = mean_i var_i``, ``mse = mean |error|²``
over the accepted (probe, rep) pairs, all relative to ``mean_i |∇f(x_i)|²``,
and ``accept``: the accepted fraction over all N particles and reps.

``--chain`` measures instead what each estimator does inside CEnLMC
(``benchmarks/results/least_squares_chain.{json,md}``): N(0, I_2), h = 0.05,
the stationary variance against ULA's exact ``1/(1 - h/2)`` (MCSE over the N
independent per-particle averages, as ``bench_fraction``) and the ensemble
fraction, for the paper's estimator at the suggested parameters (R1 at pass
probabilities 0.7 and 0.9) and for the fits with R1, R2 wide and M_f off (the
fit has no proposal density to protect: only its own tests refuse).

Run: ``python benchmarks/bench_least_squares.py [--chain]`` (``--quick``: a smoke run).
"""

from __future__ import annotations

import os

# one XLA thread: this run hung (a futex wait, no CPU) with the default thread pool,
# twice, at d = 3
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
).strip()

import math  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import base_parser, write_results  # noqa: E402

from cenlmc_jax.ensemble.least_squares import least_squares_gradient  # noqa: E402
from cenlmc_jax.pairwise import ensemble_force  # noqa: E402

COVARIANCES = {
    2: np.array([[1.0, 0.5], [0.5, 2.0]]),
    3: np.array([[1.0, 0.3, 0.0], [0.3, 2.0, 0.4], [0.0, 0.4, 0.5]]),
}


def _target(d):
    cov = COVARIANCES[d]
    prec = np.linalg.inv(cov)
    chol = np.linalg.cholesky(cov)
    log_norm = -0.5 * (d * math.log(2 * math.pi) + math.log(np.linalg.det(cov)))
    return prec, chol, log_norm


def _estimators(d, n):
    prec, _, log_norm = _target(d)
    prec = jnp.asarray(prec, jnp.float32)

    # one program per estimator: the four in one jitted program hung (XLA:CPU, no CPU
    # used) at d = 3
    def potential(x):
        return 0.5 * jnp.einsum("ni,ij,nj->n", x, prec, x)

    @jax.jit
    def paper(x, eta):
        f = potential(x)
        pf = ensemble_force(x, f, log_norm - f, eta)
        return pf.force_sum / (n - 1), pf.n_ball >= 1

    fits = {
        name: jax.jit(
            lambda x, eta, kw=kw: tuple(
                least_squares_gradient(x, potential(x), eta, method="tiled", **kw)[:2]
            )
        )
        for name, kw in (
            ("ls", {}),
            ("ls-uniform", {"kernel": "uniform"}),
            ("ls-quadratic", {"quadratic": True}),
        )
    }

    def run(x, eta):
        out = {"paper": paper(x, eta)}
        out.update({name: fit(x, eta) for name, fit in fits.items()})
        return out, x @ prec

    return run


def _stats(errs, oks, grad_sq, accept_all):
    """errs: (R, P, d), oks: (R, P); relative bias², variance, mse and the
    acceptance."""
    k = oks.sum(axis=0)
    use = k >= 2
    mean = np.where(
        use[:, None], (errs * oks[..., None]).sum(0) / np.maximum(k, 1)[:, None], 0
    )
    var = ((errs - mean) ** 2 * oks[..., None]).sum(0).sum(-1) / np.maximum(k - 1, 1)
    mse = float(((errs**2).sum(-1) * oks).sum() / max(oks.sum(), 1))
    bias2 = (mean**2).sum(-1) - var / np.maximum(
        k, 1
    )  # |mean|² less its sampling noise: unbiased for |bias|²
    return dict(
        bias2=float(bias2[use].mean() / grad_sq) if use.any() else math.nan,
        var=float(var[use].mean() / grad_sq) if use.any() else math.nan,
        mse=mse / grad_sq,
        accept=float(accept_all),
    )


def chain(args):
    import cenlmc_jax as cj

    n, steps, burn = (300, 200, 50) if args.quick else (1000, 600, 100)
    h, d = 0.05, 2
    tgt = cj.models.targets.standard_gaussian(d)
    base = cj.ensemble.tuning.suggest_cenlmc_params(d, h, num_particles=n)
    x0 = tgt.sample(jax.random.key(0), n)
    ula = 1.0 / (1.0 - h / 2)
    configs = [
        (
            "paper",
            base.eta,
            math.sqrt(2 * h * cj.ensemble.tuning.chi2_ppf(p, d)),
            base.r2,
            base.n_star,
            base.m_f,
        )
        for p in (0.7, 0.9)
    ]
    configs += [
        (est, eta, 10.0, 100.0, 1, math.inf)
        for est, eta in (
            ("least_squares", 0.2),
            ("least_squares", base.eta),
            ("least_squares", 0.5),
            ("least_squares_quadratic", base.eta),
            ("least_squares_quadratic", 0.5),
        )
    ]
    rows = []
    for est, eta, r1, r2, n_star, m_f in configs:
        algo = cj.cenlmc(
            tgt.logdensity_fn,
            h,
            eta,
            r1,
            r2,
            n_star,
            m_f,
            f_star=tgt.f_star,
            estimator=est,
        )
        res = cj.sample(
            jax.random.key(1),
            algo,
            algo.init(x0),
            steps,
            burn_in=burn,
            trace_fn=lambda s: jnp.mean(s.position**2, axis=-1),
            on_divergence="warn",
        )
        per = np.asarray(res.trace, np.float64).mean(axis=0)
        var, mcse = per.mean(), per.std(ddof=1) / math.sqrt(n)
        frac = float(np.mean(np.asarray(res.info.ensemble_fraction)))
        rows.append(
            dict(
                estimator=est,
                eta=float(eta),
                r1=float(r1),
                ensemble_fraction=frac,
                variance=float(var),
                mcse=float(mcse),
                relative_variance_error=float(var / ula - 1),
                z=float((var - ula) / mcse),
            )
        )
        print(rows[-1], flush=True)
    md = [
        {k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in r.items()}
        for r in rows
    ]
    notes = [
        f"N = {n}, h = {h}, {steps} steps after {burn} burn-in; ULA's exact variance "
        f"{ula:.4f}.",
        f"paper: eta = R2 = {base.eta:.3g}, N* = {base.n_star}, M_f = {base.m_f:.3g} "
        "(suggest_cenlmc_params), R1 at pass probabilities 0.7, 0.9.",
        "least_squares*: R1 = 10, R2 = 100, N* = 1, M_f = inf: only the fit's "
        "conditioning test refuses.",
        "mcse over the N per-particle time averages (they are correlated only through "
        "the estimator).",
    ]
    write_results(
        "least_squares_chain",
        dict(n=n, steps=steps, burn_in=burn, h=h),
        rows,
        md_rows=md,
        title="CEnLMC with the least-squares gradient vs the paper's (N(0, I_2))",
        notes=notes,
        out_dir=args.out_dir,
    )


def main():
    parser = base_parser(" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument(
        "--chain",
        action="store_true",
        help="the estimators inside CEnLMC (module docstring)",
    )
    parser.add_argument(
        "--dims",
        type=int,
        nargs="+",
        default=[2, 3],
        choices=[2, 3],
        help="the Gaussians' d",
    )
    args = parser.parse_args()
    if args.chain:
        return chain(args)
    n, probes, reps = (500, 50, 4) if args.quick else (2000, 100, 16)
    etas = {2: (0.15, 0.25, 0.4, 0.6, 0.9), 3: (0.25, 0.4, 0.6, 0.9, 1.2)}
    rows = []
    for d in args.dims:
        run = _estimators(d, n)
        _, chol, _ = _target(d)
        rng = np.random.default_rng(20261201 + d)
        xp = rng.normal(size=(probes, d)) @ chol.T
        grad_sq = float(
            np.mean(np.sum((xp @ np.linalg.inv(COVARIANCES[d])) ** 2, axis=1))
        )
        for eta in etas[d]:
            errs, oks, acc = {}, {}, {}
            for _ in range(reps):
                x = np.concatenate(
                    [xp, rng.normal(size=(n - probes, d)) @ chol.T]
                ).astype(np.float32)
                out, true = jax.device_get(run(jnp.asarray(x), jnp.float32(eta)))
                for name, (g, ok) in out.items():
                    errs.setdefault(name, []).append(g[:probes] - true[:probes])
                    oks.setdefault(name, []).append(ok[:probes])
                    acc[name] = acc.get(name, 0.0) + float(ok.mean()) / reps
            for name in errs:
                s = _stats(
                    np.array(errs[name], np.float64),
                    np.array(oks[name]),
                    grad_sq,
                    acc[name],
                )
                rows.append(dict(d=d, eta=eta, estimator=name, **s))
                print(rows[-1], flush=True)
    md = [
        {k: (f"{v:.3g}" if isinstance(v, float) else v) for k, v in r.items()}
        for r in rows
    ]
    notes = [
        f"N = {n} particles drawn from the target, {probes} probes kept, {reps} "
        "redraws of the rest; float32.",
        "bias2, var, mse: relative to the probes' mean |∇f|² (module docstring); "
        "accept: fraction of all particles.",
        "mse is the unconditional mean squared error. The split bias2 / var is "
        "conditional on all P probes, which are each other's fixed neighbours: their "
        "contribution does not average over the redraws and is counted in bias2 (most "
        "visible for the paper's estimate at small eta, whose single close pairs weigh "
        "1/pi(x_j)).",
        "paper: eq. 3.19 with p = π (the sampling density); accepted when the η-ball "
        "is not empty.",
        "ls: the linear least-squares fit (Epanechnikov kernel), ls-uniform: uniform "
        "kernel, ls-quadratic: with the quadratic term (exact on a Gaussian: its error "
        "is rounding); accepted when the conditioning test passes (floor 0.05).",
    ]
    name = "least_squares" + (
        "" if args.dims == [2, 3] else "_d" + "_".join(map(str, args.dims))
    )
    write_results(
        name,
        dict(n=n, probes=probes, reps=reps, etas=etas),
        rows,
        md_rows=md,
        columns=["d", "eta", "estimator", "bias2", "var", "mse", "accept"],
        title="Least-squares ensemble gradient vs the paper's estimate (Gaussians)",
        notes=notes,
        out_dir=args.out_dir,
    )


if __name__ == "__main__":
    main()
