"""``cenlmc_jax._keys.split_keys``: the keys of ``list(jax.random.split(key, n))``, bit
for bit, for typed and legacy keys, counts below and above the shared block, and
both settings of JAX's partitionable threefry (with it off, the prefix shortcut must
not be taken: there the keys of a split depend on the count)."""

import jax
import numpy as np
import pytest

from cenlmc_jax._keys import BLOCK, split_keys


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
