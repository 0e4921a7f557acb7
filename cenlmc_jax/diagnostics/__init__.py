"""Jittable MCMC and ensemble diagnostics.

All functions are written with ``jax.numpy`` only and use static shapes, so
they can be called inside :func:`jax.jit` (axis arguments, ``split``,
``method``, ``statistic`` and ``num_projections`` must then be static).
Argument checking happens in Python on shapes and dtypes only, *before* any
tracing, and raises :class:`ValueError` naming the offending argument, what
was given and what was expected.

Chain diagnostics take draws **chains first**, ``(num_chains, num_samples,
*event_shape)`` (ArviZ's, NumPyro's and BlackJAX's layout; for an ensemble
sampler a "chain" is a particle), or a :class:`~cenlmc_jax.run.RunResult`
directly, and return one value per coordinate, shape ``event_shape``. A
plain array whose layout looks swapped raises a :class:`LayoutWarning`
(:mod:`.layout` gives the two symptoms checked). Floating dtypes are
preserved (float64 in, float64 out when ``jax_enable_x64`` is on); integer
and boolean inputs are promoted to the default floating dtype.

Modules (this one only re-exports them)
---------------------------------------
:mod:`.layout`
    :func:`chains_first`, :class:`LayoutWarning`: the layout of draws and
    the argument checks every diagnostic shares.
:mod:`.chains` (several dependent chains)
    :func:`effective_sample_size` (``method="identity" | "mean" | "bulk" |
    "tail"``, ArviZ's names, :data:`ESS_METHODS`),
    :func:`potential_scale_reduction` (plain or ``rank=True``), :func:`mcse`
    (of the mean or the sd), :func:`autocorrelation`.
:mod:`.ensemble` (independent particles)
    :func:`ensemble_mcse`, :func:`z_score`, :func:`moment_errors`
    (:class:`MomentErrors`).
:mod:`.distances` (two samples: an ensemble against reference draws)
    :func:`mmd`, :func:`sliced_wasserstein`.
:mod:`.nested` (many short chains started in superchains)
    :func:`nested_rhat` (Margossian et al. 2024), :func:`superchain_size`,
    :func:`many_chain_diagnostics`: the many-chain verdict (nested R-hat, the
    ensemble's drift, the chains' memory against the window
    (:func:`half_correlation`), the superchains' ESS).
:mod:`.convergence` (a finished run, checked)
    :func:`convergence_problems`, :class:`ConvergenceWarning`: frozen chains,
    R-hat above 1.01, bulk ESS below ``min(100 C, 400)``; what ``cj.sample``
    warns and the CLI's verdict reports.

References
----------
A. Vehtari, A. Gelman, D. Simpson, B. Carpenter, P.-C. Bürkner (2021).
Rank-normalization, folding, and localization: an improved R-hat for
assessing convergence of MCMC. Bayesian Analysis 16(2).

C. J. Geyer (1992). Practical Markov chain Monte Carlo. Statistical Science
7(4).

A. Gretton, K. Borgwardt, M. Rasch, B. Schölkopf, A. Smola (2012). A kernel
two-sample test. JMLR 13.

N. Bonneel, J. Rabin, G. Peyré, H. Pfister (2015). Sliced and Radon
Wasserstein barycenters of measures. JMIV 51.
"""

import importlib as _importlib
import importlib.util

#: Every name -> the module of this package that defines it. They are imported the
#: first time one is used (PEP 562): the summary, which needs only ``layout``, does
#: not pay for SciPy's statistics that ``chains`` imports (issue 30).
_LAZY = {
    "ESS_METHODS": "chains",
    "autocorrelation": "chains",
    "effective_sample_size": "chains",
    "mcse": "chains",
    "potential_scale_reduction": "chains",
    "ConvergenceWarning": "convergence",
    "convergence_problems": "convergence",
    "mmd": "distances",
    "sliced_wasserstein": "distances",
    "MomentErrors": "ensemble",
    "ensemble_mcse": "ensemble",
    "moment_errors": "ensemble",
    "z_score": "ensemble",
    "nested_rhat": "nested",
    "many_chain_diagnostics": "nested",
    "superchain_size": "nested",
    "half_correlation": "nested",
    "LayoutWarning": "layout",
    "chains_first": "layout",
}

__all__ = [
    "LayoutWarning",
    "chains_first",
    "autocorrelation",
    "effective_sample_size",
    "potential_scale_reduction",
    "mcse",
    "ensemble_mcse",
    "z_score",
    "MomentErrors",
    "moment_errors",
    "mmd",
    "sliced_wasserstein",
    "ESS_METHODS",
    "ConvergenceWarning",
    "convergence_problems",
    "nested_rhat",
    "many_chain_diagnostics",
    "superchain_size",
    "half_correlation",
]


def __getattr__(name):
    if name in _LAZY:
        value = getattr(_importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    elif _importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = _importlib.import_module(f"{__name__}.{name}")  # a module: dg.plots
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(__all__) | {k for k in globals() if not k.startswith("_")})
