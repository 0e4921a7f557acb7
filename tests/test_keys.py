"""``cenlmc_jax._keys.split_keys``: the keys of ``list(jax.random.split(key, n))``, bit
for bit, for typed and legacy keys, counts below and above the shared block, and
both settings of JAX's partitionable threefry (with it off, the prefix shortcut must
not be taken: there the keys of a split depend on the count); and
``cenlmc_jax._keys.normal``: the numbers of ``jax.random.normal(key, shape, dtype)``,
bit for bit, eagerly and under ``jax.jit``, in both settings; and the superchain
starts built on the host: those of the eager JAX code they replace."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cenlmc_jax._keys import BLOCK, normal, split_keys
from cenlmc_jax.diagnostics.nested import superchain_starts


def _bits(key):
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        return np.asarray(jax.random.key_data(key))
    return np.asarray(key)


@pytest.mark.parametrize("partitionable", [True, False])
@pytest.mark.parametrize("kind", ["typed", "legacy"])
def test_split_keys_are_the_keys_of_jax_random_split(kind, partitionable):
    old = jax.config.jax_threefry_partitionable
    jax.config.update("jax_threefry_partitionable", partitionable)
    try:
        base = jax.random.key(11) if kind == "typed" else jax.random.PRNGKey(11)
        key = jax.random.fold_in(base, 3)
        for n in (1, 2, 3, 11, 38, BLOCK, BLOCK + 5):
            got = split_keys(key, n)
            want = list(jax.random.split(key, n))
            assert len(got) == n
            for g, w in zip(got, want, strict=True):
                assert g.dtype == w.dtype and g.shape == w.shape
                np.testing.assert_array_equal(_bits(g), _bits(w))
            # and they draw the same numbers
            np.testing.assert_array_equal(
                np.asarray(jax.random.normal(got[-1], (3,))),
                np.asarray(jax.random.normal(want[-1], (3,))),
            )
    finally:
        jax.config.update("jax_threefry_partitionable", old)


@pytest.mark.parametrize("partitionable", [True, False])
def test_normal_draws_the_numbers_of_jax_random_normal(partitionable):
    old = jax.config.jax_threefry_partitionable
    jax.config.update("jax_threefry_partitionable", partitionable)
    try:
        keys = (
            jax.random.key(5),
            jax.random.PRNGKey(5),
            jax.random.fold_in(jax.random.key(9), 3),
        )
        for shape in [(64, 10), (7, 3, 5), (1, 4), (4, 1), (9,), ()]:
            for dtype in (jnp.float32, None):
                for key in keys:
                    want = jax.random.normal(key, shape, dtype or jnp.float32)
                    got = normal(key, shape, dtype)
                    assert got.shape == want.shape and got.dtype == want.dtype
                    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
                    jitted = jax.jit(lambda k, s=shape, t=dtype: normal(k, s, t))(key)
                    np.testing.assert_array_equal(np.asarray(jitted), np.asarray(want))
    finally:
        jax.config.update("jax_threefry_partitionable", old)


def _superchain_starts_eagerly(key, x, m, c, logdensity_fn):
    """The eager JAX code superchain_starts replaced (kept here as the reference)."""
    n = x.shape[0]
    pick = jax.random.choice(key, n, (n // m,), replace=False)
    chosen = x[pick]
    centre = jnp.mean(x, axis=0)
    pushed = (centre + c * (chosen - centre)).astype(x.dtype)
    ok = jnp.isfinite(jax.vmap(logdensity_fn)(pushed))
    pushed = jnp.where(ok[:, None], pushed, chosen)
    return jnp.repeat(pushed, m, axis=0)


def test_superchain_starts_are_those_of_the_eager_jax_code():
    # a support that some pushed starts leave, so both branches of the check run
    def logdensity_fn(x):
        return jnp.where(jnp.all(jnp.abs(x) < 2.5), -0.5 * jnp.sum(x**2), -jnp.inf)

    for n, d, m in [(256, 10, 16), (128, 2, 4)]:
        x = 1.3 * jax.random.normal(jax.random.key(n), (n, d))
        key = jax.random.key(d)
        want = _superchain_starts_eagerly(key, x, m, 1.2, logdensity_fn)
        got = superchain_starts(key, x, m, 1.2, logdensity_fn=logdensity_fn)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        # the check replaced some pushed starts (the case exercises it)
        unchecked = superchain_starts(key, x, m, 1.2)
        assert np.any(np.asarray(unchecked) != np.asarray(got))
