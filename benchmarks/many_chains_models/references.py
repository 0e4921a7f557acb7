"""Reference moments for benchmarks/bench_many_chains.py, computed without cenlmc_jax.

    python benchmarks/many_chains_models/references.py [--lv-draws 5000]

* banana, two_modes, funnel: exact formulas (in the model files' docstrings).
* eight_schools_centered: theta integrated out analytically (y_j ~ N(mu, sigma_j^2 +
  tau^2)), then 2-D trapezoid quadrature over (mu, log tau); theta_1's moments from its
  Gaussian conditional given (mu, tau, y).
* brownian_fixed: Gaussian; its mean and covariance by linear algebra (the precision
  D^T D / innov^2 + S^T S / obs^2, D the first differences, S the observed rows).
* brownian_missing: the 30 locations integrated out analytically (y ~ N(0, innov^2 K +
  obs^2 I), K_st = min(s, t) + 1 on the observed t), then 2-D trapezoid quadrature over
  (log innov, log obs); x_15's moments from its Gaussian conditional.
* lotka_volterra: BlackJAX NUTS (window adaptation per chain) on the model file's logp,
  chains started near the literature posterior; R-hat and bulk ESS printed. The
  constrained means are printed beside the literature values (Carpenter's Stan case
  study "Predator-prey population dynamics").

Each quadrature is repeated on a grid twice as coarse; the printed "grid change" is the
largest change of any moment (a bound of the quadrature error).
Prints one JSON object: {case: {coordinate: [mean, sd]}}.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def _moments(w, *fields):
    """Mean and sd of quantities given as (conditional mean, conditional var) grids."""
    w = w / w.sum()
    out = []
    for m, v in fields:
        mean = np.sum(w * m)
        out.append([float(mean), float(np.sqrt(np.sum(w * (v + (m - mean) ** 2))))])
    return out


def eight_schools(n=1200):
    y = np.array([28.0, 8, -3, 7, -1, 1, 18, 12])
    s = np.array([15.0, 10, 16, 11, 9, 11, 10, 18])
    mu = np.linspace(-40, 50, n)[:, None, None]
    u = np.linspace(-20, 7, n)[None, :, None]  # log tau
    tau2 = np.exp(2 * u)
    var = s**2 + tau2
    logw = (
        -0.5 * (mu[..., 0] / 5) ** 2
        - np.log1p(tau2[..., 0] / 25)
        + u[..., 0]
        + np.sum(-0.5 * np.log(var) - 0.5 * (y - mu) ** 2 / var, axis=-1)
    )
    w = np.exp(logw - logw.max())
    prec = 1 / s[0] ** 2 + 1 / tau2[..., 0]
    th_mean = (y[0] / s[0] ** 2 + mu[..., 0] / tau2[..., 0]) / prec
    zero = np.zeros_like(w)
    mu_b = np.broadcast_to(mu[..., 0], w.shape)
    u_b = np.broadcast_to(u[..., 0], w.shape)
    (m_mu, m_u, m_th, m_tau) = _moments(
        w, (mu_b, zero), (u_b, zero), (th_mean, 1 / prec), (np.exp(u_b), zero)
    )
    return {"x[0]": m_mu, "x[1]": m_u, "x[2]": m_th, "tau (check)": m_tau}


def brownian(n=1000):
    sys.path.insert(0, str(HERE))
    import brownian_missing as bm

    t_obs = np.asarray(bm.OBSERVED)
    y = np.asarray(bm.Y_OBSERVED, np.float64)
    K = np.minimum.outer(t_obs, t_obs) + 1.0
    lam, Q = np.linalg.eigh(K)
    z = Q.T @ y
    k15 = Q.T @ (np.minimum(t_obs, 15) + 1.0)  # Cov(x_15, y) / innov^2, rotated
    a = np.linspace(-20, 6, n)[:, None, None]  # log innov
    b = np.linspace(-20, 6, n)[None, :, None]  # log obs
    ev = np.exp(2 * a) * lam + np.exp(2 * b)  # eigenvalues of Cov(y)
    logw = (
        -0.5 * (a[..., 0] / 2) ** 2
        - 0.5 * (b[..., 0] / 2) ** 2
        + np.sum(-0.5 * np.log(ev) - 0.5 * z**2 / ev, axis=-1)
    )
    w = np.exp(logw - logw.max())
    m15 = np.exp(2 * a[..., 0]) * np.sum(k15 * z / ev, axis=-1)
    v15 = np.exp(2 * a[..., 0]) * 16.0 - np.exp(4 * a[..., 0]) * np.sum(k15**2 / ev, -1)
    zero = np.zeros_like(w)
    a_b, b_b = np.broadcast_to(a[..., 0], w.shape), np.broadcast_to(b[..., 0], w.shape)
    m_a, m_b, m_15 = _moments(w, (a_b, zero), (b_b, zero), (m15, v15))
    return {"x[30]": m_a, "x[31]": m_b, "x[15]": m_15}


def brownian_fixed():
    sys.path.insert(0, str(HERE))
    import brownian_fixed as bf

    t_obs, n = np.asarray(bf.OBSERVED), bf.NUM_STEPS
    y = np.asarray(bf.Y_OBSERVED, np.float64)
    d = np.eye(n) - np.eye(n, k=-1)
    s = np.zeros((t_obs.size, n))
    s[np.arange(t_obs.size), t_obs] = 1.0
    prec = d.T @ d / bf.INNOV**2 + s.T @ s / bf.OBS**2
    cov = np.linalg.inv(prec)
    mean = cov @ (s.T @ y / bf.OBS**2)
    return {f"x[{i}]": [float(mean[i]), float(np.sqrt(cov[i, i]))] for i in (0, 15, 29)}


def lotka_volterra(draws, warmup=1000, chains=8, seed=0):
    import jax

    jax.config.update("jax_enable_x64", True)
    import blackjax
    import jax.numpy as jnp

    sys.path.insert(0, str(HERE))
    import lotka_volterra as lv

    from_literature = np.log([0.55, 0.028, 0.80, 0.024, 34.0, 5.9, 0.25, 0.25])
    key = jax.random.key(seed)
    x0 = jnp.asarray(from_literature) + 0.05 * jax.random.normal(key, (chains, 8))
    adapt = blackjax.window_adaptation(blackjax.nuts, lv.logp)

    @jax.jit
    def chain(k, x):
        k1, k2 = jax.random.split(k)
        (state, params), _ = adapt.run(k1, x, warmup)
        kernel = blackjax.nuts(lv.logp, **params)

        def step(s, kk):
            s, info = kernel.step(kk, s)
            return s, (s.position, info.num_integration_steps)

        _, (pos, n) = jax.lax.scan(step, state, jax.random.split(k2, draws))
        return pos, n

    pos, n = jax.vmap(chain)(jax.random.split(jax.random.key(seed + 1), chains), x0)
    pos = np.asarray(pos)  # (chains, draws, 8)
    rhat = blackjax.diagnostics.potential_scale_reduction(pos, 0, 1)
    ess = blackjax.diagnostics.effective_sample_size(pos, 0, 1)
    flat = pos.reshape(-1, 8)
    print(
        "LV NUTS: leapfrog steps/draw",
        float(np.mean(n)),
        "max R-hat",
        float(np.max(rhat)),
        "min ESS",
        float(np.min(ess)),
        file=sys.stderr,
    )
    print(
        "LV constrained means",
        np.exp(flat).mean(0).round(4).tolist(),
        "literature",
        np.exp(from_literature).round(4).tolist(),
        file=sys.stderr,
    )
    mcse = flat.std(0) / np.sqrt(np.asarray(ess))
    print("LV MCSE of the log means", mcse.round(5).tolist(), file=sys.stderr)
    return {
        f"x[{k}]": [float(flat[:, k].mean()), float(flat[:, k].std(ddof=1))]
        for k in range(8)
    }


def _check_grid(fn, n):
    fine, coarse = fn(n), fn(n // 2)
    change = max(
        abs(a - b) for k in fine for a, b in zip(fine[k], coarse[k], strict=True)
    )
    print(f"{fn.__name__}: grid change {change:.2g}", file=sys.stderr)
    return fine


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lv-draws", type=int, default=5000)
    args = p.parse_args()
    refs = {
        "eight_schools_centered": _check_grid(eight_schools, 1200),
        "brownian_missing": _check_grid(brownian, 1000),
        "brownian_fixed": brownian_fixed(),
        "lotka_volterra": lotka_volterra(args.lv_draws),
    }
    print(json.dumps(refs, indent=1))
