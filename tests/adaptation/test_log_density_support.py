"""Issue 47 ("Nothing lost"), item 2: ``cj.langevin_warmup`` on a log density that is
NaN or ``+inf`` on a region, or ``−inf`` outside a truncated support.

Before the fix every step into such a region halved the kinetic phase's step for the
whole ensemble, down to 0.0, and the warm-up failed inside the adjusted phase
("step_size must be a finite number > 0; got 0.0", later a ZeroDivisionError), naming
neither the model nor the region; a ``−inf`` outside the support (what the message now
advises) failed the same way, and the Laplace draws outside the support never moved.
The unadjusted warm-up (``sampler="lmc"``) said only "check the model or the start".
"""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cenlmc_jax as cj


def _gaussian(x):
    return -0.5 * jnp.sum(x**2)


def nan_beyond_one(x):  # 16% of N(0, I)'s mass (x_0 > 1) gives NaN
    return jnp.where(x[0] > 1.0, jnp.nan, _gaussian(x))


def inf_beyond_one(x):
    return jnp.where(x[0] > 1.0, jnp.inf, _gaussian(x))


def log_of_a_negative(x):  # a truncated support written as log(x_0): NaN for x_0 < 0
    return _gaussian(x) + jnp.log(x[0])


@pytest.mark.parametrize(
    "logdensity_fn, value, in_region",
    [
        (nan_beyond_one, "NaN", lambda x: x[0] > 1.0),
        (inf_beyond_one, "+inf", lambda x: x[0] > 1.0),
        (log_of_a_negative, "NaN", lambda x: x[0] < 0.0),
    ],
)
def test_a_region_of_nan_or_inf_is_an_error_naming_the_model_the_point_and_the_remedy(
    logdensity_fn, value, in_region
):
    positions = jax.random.normal(jax.random.key(0), (256, 2))
    with pytest.warns(UserWarning):  # the starts in the region are redrawn
        with pytest.raises(ValueError) as caught:
            cj.langevin_warmup(jax.random.key(1), logdensity_fn, positions)
    message = str(caught.value)
    assert f"the log density {logdensity_fn.__name__} is {value} at x = [" in message
    point = np.array(re.search(r"at x = \[([^\]]*)\]", message).group(1).split(), float)
    assert point.shape == (2,) and in_region(point), message
    assert f"{value}" == ("NaN" if np.isnan(logdensity_fn(point)) else "+inf")
    assert "return -inf there" in message and "unconstrained transform" in message


def minus_inf_beyond_one(x):
    return jnp.where(x[0] > 1.0, -jnp.inf, _gaussian(x))


def test_minus_inf_outside_the_support_warms_up_to_the_truncated_target():
    # N(0, I) truncated to x_0 < 1: E x_0 = -φ(1)/Φ(1), Var x_0 = 1 - φ(1)/Φ(1) - that²
    n = 1000
    phi, cdf = math.exp(-0.5) / math.sqrt(2 * math.pi), 0.5 * (1 + math.erf(1 / 2**0.5))
    mean = -phi / cdf
    sd = math.sqrt(1 + mean - mean**2)
    positions = 0.5 * jax.random.normal(jax.random.key(0), (n, 2))
    with pytest.warns(UserWarning, match="redrawn"):  # the starts beyond x_0 = 1
        wu = cj.langevin_warmup(jax.random.key(1), minus_inf_beyond_one, positions)
    x = np.asarray(wu.state.position).reshape(-1, 2)
    assert x.shape == (n, 2)
    assert np.all(x[:, 0] <= 1.0), np.sort(x[:, 0])[-5:]  # before: 128 at x_0 > 1
    # the hand-over's particles, as independent draws: 5 standard errors
    assert abs(x[:, 0].mean() - mean) < 5 * sd / math.sqrt(n), x[:, 0].mean()
    assert abs(x[:, 1].mean()) < 5 / math.sqrt(n), x[:, 1].mean()


@pytest.mark.parametrize("logdensity_fn", [nan_beyond_one, minus_inf_beyond_one])
def test_the_unadjusted_warmup_says_what_to_do_with_such_a_region(logdensity_fn):
    # LMC's windows diverge there (an unadjusted step also leaves a -inf support): the
    # error said only "check the model or the start"
    positions = jax.random.normal(jax.random.key(0), (256, 2))
    with pytest.warns(UserWarning), pytest.raises(RuntimeError) as caught:
        cj.langevin_warmup(jax.random.key(1), logdensity_fn, positions, sampler="lmc")
    message = str(caught.value)
    assert "not finite where the chain goes" in message, message
    assert "unconstrained transform" in message and "sampler='hmc'" in message
