"""cenlmc_jax._batch.batch_logdensity: the log density at each row, one compiled
program for a hashable function, eagerly for one that cannot be hashed."""

import jax
import jax.numpy as jnp
import numpy as np

from cenlmc_jax._batch import batch_logdensity


def _logp(x):
    return -0.5 * jnp.sum(x**2) + jnp.sin(x[0])


class _Unhashable:
    # a callable with __eq__ and no __hash__ (Python then sets __hash__ = None):
    # jax.jit cannot take it as a static argument
    def __eq__(self, other):
        return isinstance(other, _Unhashable)

    def __call__(self, x):
        return _logp(x)


def test_batch_logdensity_equals_the_vmapped_function_hashable_or_not():
    x = jax.random.normal(jax.random.key(0), (7, 3))
    expected = np.asarray(jax.vmap(_logp)(x))
    np.testing.assert_allclose(batch_logdensity(x, _logp), expected, rtol=1e-6)
    np.testing.assert_allclose(batch_logdensity(x, _Unhashable()), expected, rtol=1e-6)


def test_batch_logdensity_compiles_once_per_function_and_shape():
    # the point of the helper: one program per (function, shape), reused
    from cenlmc_jax import _batch

    x = jax.random.normal(jax.random.key(1), (5, 2))

    def f(y):
        return -jnp.sum(jnp.abs(y))

    before = _batch._jitted._cache_size()
    batch_logdensity(x, f)
    batch_logdensity(x + 1.0, f)
    assert _batch._jitted._cache_size() == before + 1
    batch_logdensity(x[:3], f)  # a new shape: a second program
    assert _batch._jitted._cache_size() == before + 2
