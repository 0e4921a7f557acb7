"""The local least-squares ensemble gradient against the paper's importance-weighted estimate, at equal η.

Both estimate ``∇f`` at a particle from its neighbours in the η-ball of an
ensemble drawn from the target ``π ∝ exp(-f)`` (here Gaussians, 2-D and 3-D,
correlated, ``∇f(x) = Σ⁻¹ x``):

* ``paper``: eq. 3.19-3.21 with the sampling density as the proposal,
  ``F_i = 1/(N-1) Σ_j α_d (f_j - f_i)/|x_j - x_i|² 1[|x_j - x_i| ≤ η] / π(x_j) (x_j - x_i)``
  (``cenlmc_jax.pairwise.ensemble_force`` with ``log_p = log π``, no w);
  a particle "accepts" it when its ball is not empty (the library's guard,
  ``min_ball_neighbours = 1``; the R1 / R2 / N* tests need a chain and are
  not part of this static comparison);
* ``ls`` / ``ls-uniform``: :func:`cenlmc_jax.ensemble.least_squares.least_squares_gradient`,
  the linear fit with the Epanechnikov / uniform kernel; accepted when its
  conditioning test passes (default floor 0.05);
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

Run: ``python benchmarks/bench_least_squares.py`` (``--quick``: a smoke run).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from _common import base_parser, write_results

from cenlmc_jax.ensemble.least_squares import least_squares_gradient
from cenlmc_jax.pairwise import ensemble_force

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

    @jax.jit
    def run(x, eta):
        f = 0.5 * jnp.einsum("ni,ij,nj->n", x, prec, x)
        log_p = log_norm - f
        pf = ensemble_force(x, f, log_p, eta)
        out = {"paper": (pf.force_sum / (n - 1), pf.n_ball >= 1)}
        for name, kw in (("ls", {}), ("ls-uniform", {"kernel": "uniform"}), ("ls-quadratic", {"quadratic": True})):
            r = least_squares_gradient(x, f, eta, method="tiled", **kw)
            out[name] = (r.grad, r.ok)
        return out, x @ prec

    return run


def _stats(errs, oks, grad_sq, accept_all):
    """errs: (R, P, d), oks: (R, P); relative bias², variance, mse and the acceptance."""
    k = oks.sum(axis=0)
    use = k >= 2
    mean = np.where(use[:, None], (errs * oks[..., None]).sum(0) / np.maximum(k, 1)[:, None], 0)
    var = ((errs - mean) ** 2 * oks[..., None]).sum(0).sum(-1) / np.maximum(k - 1, 1)
    mse = float(((errs**2).sum(-1) * oks).sum() / max(oks.sum(), 1))
    bias2 = (mean**2).sum(-1) - var / np.maximum(k, 1)  # |mean|² less its sampling noise: unbiased for |bias|²
    return dict(bias2=float(bias2[use].mean() / grad_sq) if use.any() else math.nan,
                var=float(var[use].mean() / grad_sq) if use.any() else math.nan,
                mse=mse / grad_sq, accept=float(accept_all))


def main():
    parser = base_parser(__doc__.splitlines()[0])
    args = parser.parse_args()
    n, probes, reps = (500, 50, 4) if args.quick else (2000, 100, 16)
    etas = {2: (0.15, 0.25, 0.4, 0.6, 0.9), 3: (0.25, 0.4, 0.6, 0.9, 1.2)}
    rows = []
    for d in (2, 3):
        run = _estimators(d, n)
        _, chol, _ = _target(d)
        rng = np.random.default_rng(20261201 + d)
        xp = rng.normal(size=(probes, d)) @ chol.T
        grad_sq = float(np.mean(np.sum((xp @ np.linalg.inv(COVARIANCES[d])) ** 2, axis=1)))
        for eta in etas[d]:
            errs, oks, acc = {}, {}, {}
            for _ in range(reps):
                x = np.concatenate([xp, rng.normal(size=(n - probes, d)) @ chol.T]).astype(np.float32)
                out, true = jax.device_get(run(jnp.asarray(x), jnp.float32(eta)))
                for name, (g, ok) in out.items():
                    errs.setdefault(name, []).append(g[:probes] - true[:probes])
                    oks.setdefault(name, []).append(ok[:probes])
                    acc[name] = acc.get(name, 0.0) + float(ok.mean()) / reps
            for name in errs:
                s = _stats(np.array(errs[name], np.float64), np.array(oks[name]), grad_sq, acc[name])
                rows.append(dict(d=d, eta=eta, estimator=name, **s))
                print(rows[-1], flush=True)
    md = [{k: (f"{v:.3g}" if isinstance(v, float) else v) for k, v in r.items()} for r in rows]
    notes = [
        f"N = {n} particles drawn from the target, {probes} probes kept, {reps} redraws of the rest; float32.",
        "bias2, var, mse: relative to the probes' mean |∇f|² (module docstring); accept: fraction of all particles.",
        "paper: eq. 3.19 with p = π (the sampling density); accepted when the η-ball is not empty.",
        "ls: the linear least-squares fit (Epanechnikov kernel), ls-uniform: uniform kernel, "
        "ls-quadratic: with the quadratic term (exact on a Gaussian: its error is rounding); "
        "accepted when the conditioning test passes (floor 0.05).",
    ]
    write_results("least_squares", dict(n=n, probes=probes, reps=reps, etas=etas), rows, md_rows=md,
                  columns=["d", "eta", "estimator", "bias2", "var", "mse", "accept"],
                  title="Least-squares ensemble gradient vs the paper's estimate (Gaussians)", notes=notes,
                  out_dir=args.out_dir)


if __name__ == "__main__":
    main()
