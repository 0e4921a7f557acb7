"""Array aliases shared by the samplers.

States and infos are NamedTuples (plain pytrees), defined beside the
sampler that owns them; this module only names the array kinds once.
"""

from collections.abc import Callable
from typing import Any

import jax

Array = jax.Array
ArrayLike = Any
PRNGKey = jax.Array  # a typed key (jax.random.key) or a legacy uint32[2] PRNGKey
PyTree = Any
LogDensityFn = Callable[[Array], Array]  # one particle (d,) -> scalar log p(x) + const
StepFn = Callable[[PRNGKey, Any], tuple]  # (rng_key, state) -> (state, info)
GradEstimator = Callable[
    [PRNGKey, Array], Array
]  # (rng_key, x) -> estimate of ∇ log density at x
