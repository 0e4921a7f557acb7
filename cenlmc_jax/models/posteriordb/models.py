"""The ten posteriordb models in JAX, on Stan's unconstrained scale, with the
log-Jacobians of Stan's transforms.

Each builder takes the posterior's data (a dict of NumPy arrays, as in
``data/<name>.json``) and returns a :class:`Model`: ``logdensity(x)`` for one
unconstrained point ``x: (d,)`` (the log posterior up to a constant, Stan's ``target``
plus the log-Jacobian of each constraining transform), ``d``, and ``constrain(x)``, the
constrained parameters (and the transformed parameters the reference reports, e.g. eight
schools' ``theta``) under Stan's names, vectors as arrays. The unconstrained coordinates
follow the order of Stan's ``parameters`` block; ``unconstrained_names`` says which is
which.

Stan's transforms (Stan Reference Manual, "Constraint transforms"), ``u`` unconstrained:

* ``<lower=0>``: ``x = exp(u)``, ``log|dx/du| = u``;
* ``<lower=a, upper=b>``: ``x = a + (b - a) σ(u)``, ``log|dx/du| = log(b - a) + log σ(u)
  + log σ(-u)`` (``σ`` the logistic function); garch's ``beta1 <upper=1 - alpha1>`` is
  this with ``b`` a function of ``alpha1``, whose Jacobian is still triangular, so the
  log-determinant is the sum of the diagonal terms.

Constant terms that Stan's ``~`` statements drop (normalising constants, the truncation
of a half-Cauchy at 0) are kept or dropped as the written-out densities have them: the
log density is defined up to a constant. Data are held in float64 and cast to the
position's dtype at each call (float32 in ⇒ float32 out; float64 in ⇒ float64 out).
``gp_pois_regr`` adds Stan's jitter ``1e-10`` to its kernel matrix before a
Cholesky factorisation: meaningful in float64 only (in float32 the factor of the
near-singular kernel can be NaN); run it with ``jax_enable_x64``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy import stats

Array = Any


class Model(NamedTuple):
    """One model: ``logdensity(x)``, ``d``, ``constrain(x) -> dict`` and the names of
    the coordinates of ``x``.
    """

    logdensity: Callable[[Array], Array]
    d: int
    constrain: Callable[[Array], dict]
    unconstrained_names: tuple


def _positive(u: Array) -> tuple[Array, Array]:
    """``<lower=0>``: ``(exp(u), log-Jacobian u)``."""
    return jnp.exp(u), u


def _interval(u: Array, lower: Array, upper: Array) -> tuple[Array, Array]:
    """``<lower, upper>``: ``(lower + (upper - lower) σ(u), log(upper - lower) + log
    σ(u) + log σ(-u))``.
    """
    width = upper - lower
    return lower + width * jax.nn.sigmoid(u), jnp.log(width) + jax.nn.log_sigmoid(
        u
    ) + jax.nn.log_sigmoid(-u)


def _cast(data: dict, x: Array) -> dict:
    return {k: jnp.asarray(v, x.dtype) for k, v in data.items()}


def _names(*groups: tuple[str, int]) -> tuple:
    """``("beta", 2), ("sigma", 0)`` -> ``("beta[1]", "beta[2]", "log(sigma)")``-style
    names (0: a scalar).
    """
    out = []
    for name, n in groups:
        out += [name] if n == 0 else [f"{name}[{i + 1}]" for i in range(n)]
    return tuple(out)


def ark(data: dict) -> Model:
    """arK: AR(K) regression; ``alpha, beta ~ N(0, 10)``, ``sigma ~ Cauchy(0, 2.5)``,
    ``sigma > 0``.
    """
    K, T = int(data["K"]), int(data["T"])
    y = np.asarray(data["y"], np.float64)
    d0 = {
        "lags": np.stack([y[K - k : T - k] for k in range(1, K + 1)], axis=1),
        "target": y[K:],
    }

    def split(x):
        sigma, log_j = _positive(x[K + 1])
        return x[0], x[1 : K + 1], sigma, log_j

    def logdensity(x):
        dd = _cast(d0, x)
        alpha, beta, sigma, log_j = split(x)
        lp = stats.norm.logpdf(alpha, 0.0, 10.0) + jnp.sum(
            stats.norm.logpdf(beta, 0.0, 10.0)
        )
        lp += stats.cauchy.logpdf(sigma, 0.0, 2.5)
        return (
            lp
            + jnp.sum(stats.norm.logpdf(dd["target"], alpha + dd["lags"] @ beta, sigma))
            + log_j
        )

    def constrain(x):
        alpha, beta, sigma, _ = split(x)
        return {"alpha": alpha, "beta": beta, "sigma": sigma}

    return Model(
        logdensity,
        K + 2,
        constrain,
        _names(("alpha", 0), ("beta", K), ("log(sigma)", 0)),
    )


def arma11(data: dict) -> Model:
    """ARMA(1, 1); ``err[1] = y[1] - mu (1 + phi)``, ``err[t] = y[t] - mu - phi y[t-1] -
    theta err[t-1]``.
    """
    d0 = {"y": np.asarray(data["y"], np.float64)}

    def errors(mu, phi, theta, y):
        def one(err_prev, yy):
            err = yy[1] - (mu + phi * yy[0] + theta * err_prev)
            return err, err

        err1 = y[0] - (mu + phi * mu)
        _, rest = jax.lax.scan(one, err1, jnp.stack([y[:-1], y[1:]], axis=1))
        return jnp.concatenate([err1[None], rest])

    def logdensity(x):
        y = _cast(d0, x)["y"]
        mu, phi, theta = x[0], x[1], x[2]
        sigma, log_j = _positive(x[3])
        lp = (
            stats.norm.logpdf(mu, 0.0, 10.0)
            + stats.norm.logpdf(phi, 0.0, 2.0)
            + stats.norm.logpdf(theta, 0.0, 2.0)
        )
        lp += stats.cauchy.logpdf(sigma, 0.0, 2.5)
        return (
            lp
            + jnp.sum(stats.norm.logpdf(errors(mu, phi, theta, y), 0.0, sigma))
            + log_j
        )

    def constrain(x):
        return {"mu": x[0], "phi": x[1], "theta": x[2], "sigma": jnp.exp(x[3])}

    return Model(logdensity, 4, constrain, ("mu", "phi", "theta", "log(sigma)"))


def diamonds(data: dict) -> Model:
    """brms's diamonds regression: centred predictors, ``b ~ N(0, 1)``, ``Intercept ~
    t_3(8, 10)``, ``sigma ~ t_3(0, 10)`` truncated at 0 (a constant), ``Y ~
    N(Intercept + Xc b, sigma)``.
    """
    X = np.asarray(data["X"], np.float64)
    Xc = X[:, 1:] - X[:, 1:].mean(axis=0)
    kc = Xc.shape[1]
    d0 = {"Xc": Xc, "Y": np.asarray(data["Y"], np.float64)}

    def logdensity(x):
        dd = _cast(d0, x)
        b, intercept = x[:kc], x[kc]
        sigma, log_j = _positive(x[kc + 1])
        lp = jnp.sum(stats.norm.logpdf(b, 0.0, 1.0)) + stats.t.logpdf(
            intercept, 3.0, 8.0, 10.0
        )
        lp += stats.t.logpdf(sigma, 3.0, 0.0, 10.0)
        return (
            lp
            + jnp.sum(stats.norm.logpdf(dd["Y"], intercept + dd["Xc"] @ b, sigma))
            + log_j
        )

    def constrain(x):
        return {"b": x[:kc], "Intercept": x[kc], "sigma": jnp.exp(x[kc + 1])}

    return Model(
        logdensity,
        kc + 2,
        constrain,
        _names(("b", kc), ("Intercept", 0), ("log(sigma)", 0)),
    )


def _linear_regression(X: np.ndarray, y: np.ndarray, prior: Callable | None) -> Model:
    """``y ~ N(X beta, sigma)``, ``sigma > 0``, ``prior(beta, sigma)`` (None: Stan's
    flat prior).
    """
    k = X.shape[1]
    d0 = {"X": X, "y": y}

    def logdensity(x):
        dd = _cast(d0, x)
        beta = x[:k]
        sigma, log_j = _positive(x[k])
        lp = jnp.sum(stats.norm.logpdf(dd["y"], dd["X"] @ beta, sigma)) + log_j
        return lp if prior is None else lp + prior(beta, sigma)

    def constrain(x):
        return {"beta": x[:k], "sigma": jnp.exp(x[k])}

    return Model(logdensity, k + 1, constrain, _names(("beta", k), ("log(sigma)", 0)))


def _with_intercept(*columns) -> np.ndarray:
    cols = [np.asarray(c, np.float64) for c in columns]
    return np.stack([np.ones_like(cols[0]), *cols], axis=1)


def earn_height(data: dict) -> Model:
    """earnings: ``earn ~ N(beta[1] + beta[2] height, sigma)``, flat priors (earnings in
    dollars).
    """
    return _linear_regression(
        _with_intercept(data["height"]), np.asarray(data["earn"], np.float64), None
    )


def kidscore_momiq(data: dict) -> Model:
    """kidiq: ``kid_score ~ N(beta[1] + beta[2] mom_iq, sigma)``, ``sigma ~ Cauchy(0,
    2.5)``, flat beta.
    """
    prior = lambda beta, sigma: stats.cauchy.logpdf(sigma, 0.0, 2.5)  # noqa: E731
    return _linear_regression(
        _with_intercept(data["mom_iq"]),
        np.asarray(data["kid_score"], np.float64),
        prior,
    )


def logmesquite(data: dict) -> Model:
    """mesquite: log weight on the logs of five size measures and ``group``; flat
    priors.
    """
    cols = [
        np.log(np.asarray(data[k], np.float64))
        for k in ("diam1", "diam2", "canopy_height", "total_height", "density")
    ]
    X = _with_intercept(*cols, data["group"])
    return _linear_regression(X, np.log(np.asarray(data["weight"], np.float64)), None)


def blr(data: dict) -> Model:
    """sblrc-blr: ``beta ~ N(0, 10)``, ``sigma ~ N(0, 10)`` (half-normal), ``y ~ N(X
    beta, sigma)``.
    """

    def prior(beta, sigma):
        return jnp.sum(stats.norm.logpdf(beta, 0.0, 10.0)) + stats.norm.logpdf(
            sigma, 0.0, 10.0
        )

    return _linear_regression(
        np.asarray(data["X"], np.float64), np.asarray(data["y"], np.float64), prior
    )


def eight_schools_noncentered(data: dict) -> Model:
    """Eight schools, non-centred: ``theta = mu + tau theta_trans``, ``theta_trans ~
    N(0, 1)``, ``y ~ N(theta, sigma)``, ``mu ~ N(0, 5)``, ``tau ~ Cauchy(0, 5)``, ``tau
    > 0``.
    """
    J = int(data["J"])
    d0 = {
        "y": np.asarray(data["y"], np.float64),
        "sigma": np.asarray(data["sigma"], np.float64),
    }

    def split(x):
        tau, log_j = _positive(x[J + 1])
        return x[:J], x[J], tau, log_j

    def logdensity(x):
        dd = _cast(d0, x)
        theta_trans, mu, tau, log_j = split(x)
        lp = jnp.sum(stats.norm.logpdf(theta_trans, 0.0, 1.0))
        lp += jnp.sum(stats.norm.logpdf(dd["y"], mu + tau * theta_trans, dd["sigma"]))
        return (
            lp
            + stats.norm.logpdf(mu, 0.0, 5.0)
            + stats.cauchy.logpdf(tau, 0.0, 5.0)
            + log_j
        )

    def constrain(x):
        theta_trans, mu, tau, _ = split(x)
        return {
            "theta_trans": theta_trans,
            "mu": mu,
            "tau": tau,
            "theta": mu + tau * theta_trans,
        }

    return Model(
        logdensity,
        J + 2,
        constrain,
        _names(("theta_trans", J), ("mu", 0), ("log(tau)", 0)),
    )


def garch11(data: dict) -> Model:
    """GARCH(1, 1): ``sigma[t]² = alpha0 + alpha1 (y[t-1] - mu)² + beta1 sigma[t-1]²``,
    ``y ~ N(mu, sigma)``; ``alpha0 > 0``, ``0 < alpha1 < 1``, ``0 < beta1 < 1 -
    alpha1``; flat priors on the constrained scale.
    """
    d0 = {
        "y": np.asarray(data["y"], np.float64),
        "sigma1": np.asarray(data["sigma1"], np.float64),
    }

    def split(x):
        alpha0, j0 = _positive(x[1])
        alpha1, j1 = _interval(x[2], 0.0, 1.0)
        beta1, j2 = _interval(x[3], 0.0, 1.0 - alpha1)
        return x[0], alpha0, alpha1, beta1, j0 + j1 + j2

    def logdensity(x):
        dd = _cast(d0, x)
        y = dd["y"]
        mu, alpha0, alpha1, beta1, log_j = split(x)

        def one(var_prev, y_prev):
            var = alpha0 + alpha1 * (y_prev - mu) ** 2 + beta1 * var_prev
            return var, var

        _, var = jax.lax.scan(one, dd["sigma1"] ** 2, y[:-1])
        sigma = jnp.concatenate([dd["sigma1"][None], jnp.sqrt(var)])
        return jnp.sum(stats.norm.logpdf(y, mu, sigma)) + log_j

    def constrain(x):
        mu, alpha0, alpha1, beta1, _ = split(x)
        return {"mu": mu, "alpha0": alpha0, "alpha1": alpha1, "beta1": beta1}

    return Model(
        logdensity,
        4,
        constrain,
        ("mu", "log(alpha0)", "logit(alpha1)", "logit(beta1/(1-alpha1))"),
    )


def gp_pois_regr(data: dict) -> Model:
    """Latent GP Poisson regression: ``f = chol(K(alpha, rho) + 1e-10 I) f_tilde``, ``k
    ~ Poisson(exp f)``; ``rho ~ Gamma(25, rate 4)``, ``alpha ~ N(0, 2)``, ``f_tilde ~
    N(0, 1)``, ``rho, alpha > 0``. float64.
    """
    n = int(data["N"])
    xs = np.asarray(data["x"], np.float64)
    k = np.asarray(data["k"], np.float64)
    d0 = {
        "sq": (xs[:, None] - xs[None, :]) ** 2,
        "k": k,
        "log_k_fact": np.array([sum(math.lgamma(v + 1) for v in k)]),
    }

    def split(x, dd):
        rho, j_rho = _positive(x[0])
        alpha, j_alpha = _positive(x[1])
        cov = alpha**2 * jnp.exp(-dd["sq"] / (2.0 * rho**2)) + 1e-10 * jnp.eye(
            n, dtype=x.dtype
        )
        f = jnp.linalg.cholesky(cov) @ x[2:]
        return rho, alpha, f, j_rho + j_alpha

    def logdensity(x):
        dd = _cast(d0, x)
        rho, alpha, f, log_j = split(x, dd)
        lp = stats.gamma.logpdf(rho, 25.0, scale=0.25) + stats.norm.logpdf(
            alpha, 0.0, 2.0
        )
        lp += jnp.sum(stats.norm.logpdf(x[2:], 0.0, 1.0))
        return lp + jnp.sum(dd["k"] * f - jnp.exp(f)) - dd["log_k_fact"][0] + log_j

    def constrain(x):
        rho, alpha, f, _ = split(x, _cast(d0, x))
        return {"rho": rho, "alpha": alpha, "f_tilde": x[2:], "f": f}

    return Model(
        logdensity,
        n + 2,
        constrain,
        _names(("log(rho)", 0), ("log(alpha)", 0), ("f_tilde", n)),
    )


#: posteriordb name -> builder
BUILDERS: dict[str, Callable[[dict], Model]] = {
    "arK-arK": ark,
    "arma-arma11": arma11,
    "diamonds-diamonds": diamonds,
    "earnings-earn_height": earn_height,
    "eight_schools-eight_schools_noncentered": eight_schools_noncentered,
    "garch-garch11": garch11,
    "gp_pois_regr-gp_pois_regr": gp_pois_regr,
    "kidiq-kidscore_momiq": kidscore_momiq,
    "mesquite-logmesquite": logmesquite,
    "sblrc-blr": blr,
}
