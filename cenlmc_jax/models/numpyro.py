"""NumPyro models in: ``cj.from_numpyro(model, *args, **kwargs)``.

A NumPyro model is a Python function of its data with ``numpyro.sample`` statements.
Every sampler here takes a log density of one flat point ``x: (d,)`` on an unconstrained
space; this module gets it from NumPyro's own machinery, without re-implementing any
transform:

* ``numpyro.infer.util.initialize_model(key, model, model_args=args,
  model_kwargs=kwargs)`` traces the model once and returns NumPyro's ``potential_fn``
  (the negative log joint of the latent sites on the unconstrained scale, each site's
  bijection to its support and its log-Jacobian included: for a ``HalfCauchy`` scale
  ``tau = exp(u)``, ``+u``) and ``postprocess_fn`` (unconstrained -> constrained,
  ``numpyro.deterministic`` sites included);
* the unconstrained latent sites are a dict ``{site: array}``;
  ``jax.flatten_util.ravel_pytree`` flattens it to ``x`` at the boundary (sites in
  sorted name order, each in C order), and ``unravel`` maps back.

So ``logdensity_fn(x) = -potential_fn(unravel(x))``, ``constrain(x) =
postprocess_fn(unravel(x))``. Only continuous latent sites are supported (a discrete
latent site is refused with a ``ValueError``: the samplers here need gradients). A
latent site with an improper prior (``dist.ImproperUniform``) is accepted, as NumPyro
accepts it: the model is traced, and started, with NumPyro's ``init_to_uniform``
(uniform on ``(-2, 2)`` on the unconstrained scale), never a prior draw; the posterior
must then be proper, which no check here can tell. NumPyro is an optional dependency
(``pip install numpyro``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

__all__ = ["NumPyroModel", "from_numpyro"]


class NumPyroModel(NamedTuple):
    """A NumPyro model seen as a flat unconstrained log density.

    Attributes:
      logdensity_fn: ``x: (d,) -> scalar``, ``-potential_fn`` of NumPyro (log joint up
        to a constant, on the unconstrained scale); the result has ``x``'s dtype.
      d: the number of unconstrained coordinates.
      constrain: ``x: (d,) -> {site: array}``, the latent sites on their support and the
        deterministic sites (``jax.vmap`` it over draws).
      names: the name of each coordinate of ``x``: the site's name for a scalar site,
        ``site[i]`` (``site[i,j]``) for an array site, 0-based and in C order; the
        coordinate is the site's *unconstrained* value (e.g. ``log tau`` for a positive
        ``tau``).
      unravel: ``x -> {site: unconstrained array}``, ``jax.flatten_util``'s inverse of
        the flattening.
      initial_position: ``(d,)``, NumPyro's ``init_to_uniform`` start (uniform on ``(-2,
        2)`` on the unconstrained scale, as Stan's), drawn with key 0; draw your own
        starts for several chains.
      dims: ``{site: (dim name, ...)}`` for the array sites that ``constrain`` returns,
        one name per axis: the ``numpyro.plate`` a batch axis lies in (``("J",)`` for
        eight schools' ``theta``), else ArviZ's ``site_dim_i``; what
        ``cj.to_arviz(result, model=m)`` labels the posterior's axes with.

    ``cj.summary(result, model=m)``, ``cj.to_arviz(result, model=m)`` and the
    ``cj.diagnostics.plots`` functions with ``model=m`` show the constrained sites under
    their names (:mod:`cenlmc_jax.diagnostics.named_draws`).
    """

    logdensity_fn: Callable[[Any], Any]
    d: int
    constrain: Callable[[Any], dict]
    names: tuple
    unravel: Callable[[Any], dict]
    initial_position: Any
    dims: Any = None


def _import_numpyro():
    try:
        from numpyro.infer.util import initialize_model
    except ImportError as err:  # pragma: no cover - run where numpyro is absent
        raise ImportError(
            "cj.from_numpyro needs NumPyro, an optional dependency: pip install "
            "numpyro "
            '(or pip install "cenlmc_jax[numpyro]")'
        ) from err
    return initialize_model


def _coordinate_names(sites: dict) -> tuple:
    names = []
    # ravel_pytree's order: a dict's leaves by sorted key
    for site in sorted(sites):
        shape = np.shape(sites[site])
        if shape == ():
            names.append(site)
        else:
            names += [
                f"{site}[{','.join(map(str, idx))}]" for idx in np.ndindex(*shape)
            ]
    return tuple(names)


def _trace(model: Callable, args: tuple, kwargs: dict) -> dict:
    """One trace of the model, its latent sites drawn as NumPyro's
    ``initialize_model`` draws them: by ``init_to_uniform`` (uniform on ``(-2, 2)``
    on the unconstrained scale), not from the prior, so a latent site with no
    ``sample()`` (an ``ImproperUniform``) traces as NumPyro accepts it. Discrete
    sites (left to the prior by ``init_to_uniform``) are refused after it.
    """
    from numpyro import handlers
    from numpyro.infer.initialization import init_to_uniform

    seeded = handlers.seed(model, jax.random.key(0))
    return handlers.trace(
        handlers.substitute(seeded, substitute_fn=init_to_uniform)
    ).get_trace(*args, **kwargs)


def _site_dims(model_trace: dict) -> dict:
    """``{site: dim names}`` of the latent and deterministic array sites.

    A batch axis inside a plate takes the plate's name (``frame.dim`` counts from
    the right of the batch shape, i.e. of the shape less the distribution's event
    dims), any other axis ArviZ's default ``site_dim_i``.
    """
    dims = {}
    for name, site in model_trace.items():
        kind = site.get("type")
        if kind not in ("sample", "deterministic") or site.get("is_observed", False):
            continue
        shape = np.shape(site["value"])
        if not shape:
            continue
        names = [f"{name}_dim_{i}" for i in range(len(shape))]
        batch = len(shape) - (
            getattr(site.get("fn"), "event_dim", 0) if kind == "sample" else 0
        )
        for frame in site.get("cond_indep_stack", ()):
            axis = batch + frame.dim
            if 0 <= axis < len(shape) and shape[axis] == frame.size:
                names[axis] = frame.name
        dims[name] = tuple(names)
    return dims


def _check_continuous(model_trace: dict) -> None:
    """Refuse what has no fixed, continuous log density, from one trace of the model.

    Before NumPyro tries to initialise it: a discrete latent site (NumPyro would
    enumerate it); a subsampled plate (its log density is a different minibatch
    estimate at every evaluation, which no sampler here may treat as the target).
    """
    for name, site in model_trace.items():
        if site.get("type") == "plate":
            size, subsample = (tuple(site.get("args") or ()) + (None, None))[:2]
            if subsample is not None and size is not None and subsample < size:
                raise ValueError(
                    f"model: plate {name!r} subsamples {subsample} of {size} (a "
                    "minibatch): its log density changes at every evaluation, so "
                    "it is no target for these samplers; drop subsample_size (or use "
                    "a stochastic-gradient sampler, cj.sgld / cj.sghmc, with "
                    "cj.gradients.minibatch_grad_estimator)"
                )
            continue
        if site.get("type") != "sample" or site.get("is_observed", False):
            continue
        support = getattr(site.get("fn"), "support", None)
        if getattr(support, "is_discrete", False):
            raise ValueError(
                f"model: latent site {name!r} is discrete "
                f"({type(site['fn']).__name__}); expected only continuous latent "
                "sites (the samplers need gradients): marginalise it out in the "
                "model"
            )


def from_numpyro(model: Callable, *args: Any, **kwargs: Any) -> NumPyroModel:
    """The unconstrained log density of a NumPyro model.

    Through NumPyro's ``initialize_model``. ``model(*args, **kwargs)`` is traced
    once (so pass the observed data here, as to ``MCMC.run``); the result's
    ``logdensity_fn`` is what every sampler of this library takes::

        m = cj.from_numpyro(eight_schools, J, sigma, y=y)
        algo = cj.vmap_chains(cj.rwmh(m.logdensity_fn, step_size=0.3))
        # {site: (draws, chains, ...)}
        draws = jax.vmap(jax.vmap(m.constrain))(result.trace)
        # the constrained sites, by name
        print(cj.summary(result, model=m))

    Args:
      model: a NumPyro model (a callable with ``numpyro.sample`` statements).
      *args: its positional arguments (the data).
      **kwargs: its keyword arguments (the observed data).

    Returns:
      The :class:`NumPyroModel`.

    Raises:
      ImportError: without NumPyro (the message names ``pip install numpyro``).
      ValueError: a ``model`` that is not callable, has no latent site, or has a
        discrete latent site.
    """
    initialize_model = _import_numpyro()
    if not callable(model):
        raise ValueError(
            f"model={model!r}: expected a NumPyro model (a callable with "
            "numpyro.sample statements)"
        )
    model_trace = _trace(model, args, kwargs)
    _check_continuous(model_trace)
    info = initialize_model(
        jax.random.key(0), model, model_args=args, model_kwargs=kwargs or None
    )
    sites = info.param_info.z
    flat, unravel = ravel_pytree(sites)
    if flat.size == 0:
        raise ValueError(
            f"model={getattr(model, '__name__', model)!r}: expected at least one "
            "latent sample site, found none (every site is observed)"
        )
    potential_fn, postprocess_fn = info.potential_fn, info.postprocess_fn

    def logdensity_fn(x):
        x = jnp.asarray(x)
        return (-potential_fn(unravel(x))).astype(x.dtype)

    def constrain(x):
        return postprocess_fn(unravel(jnp.asarray(x)))

    return NumPyroModel(
        logdensity_fn,
        int(flat.size),
        constrain,
        _coordinate_names(sites),
        unravel,
        flat,
        _site_dims(model_trace),
    )
