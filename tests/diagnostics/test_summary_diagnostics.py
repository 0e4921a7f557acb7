"""``diagnostics.chains.summary_diagnostics`` (what ``cj.summary`` shows) against the
public diagnostics.

The summary computes its ESS, R-hat and MCSE columns in one pass: the ranks
sorted once per coordinate on the host, one compiled function per shape
(issue 17). The public functions (``mcse``, ``effective_sample_size``,
``potential_scale_reduction``), each held to ArviZ in test_diagnostics.py,
are the reference: the same formulas, so equal to rounding (rtol 1e-12 in
float64; measured 0 on these draws). The draws include ties (rounded values:
average ranks), an odd number of draws (split chains drop the middle one) and
a constant coordinate (``nan``).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from cenlmc_jax import diagnostics as dg
from cenlmc_jax.diagnostics import chains
from cenlmc_jax.diagnostics.summary import _x64


def draws(seed, m, n):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, n, 3)).cumsum(axis=1) * 0.1 + rng.standard_normal(
        (m, n, 3)
    )
    x[..., 1] = np.round(x[..., 1], 1)  # many ties
    x[..., 2] = 0.5  # constant
    return x


def reference(x):
    x = jax.numpy.asarray(x)
    return {
        "mcse_mean": dg.mcse(x, 0, 1, split=True),
        "mcse_sd": dg.mcse(x, 0, 1, statistic="sd", split=True),
        "ess_bulk": dg.effective_sample_size(x, 0, 1, method="bulk"),
        "ess_tail": dg.effective_sample_size(x, 0, 1, method="tail"),
        "r_hat": dg.potential_scale_reduction(x, 0, 1, rank=True),
    }


@pytest.mark.parametrize("m, n", [(4, 100), (3, 41)])
def test_equal_to_the_public_diagnostics(m, n):
    with _x64():
        x = draws(m + n, m, n)
        got, want = chains.summary_diagnostics(x), reference(x)
    assert set(got) == set(want)
    for key, value in want.items():
        np.testing.assert_allclose(got[key], np.asarray(value), rtol=1e-12, err_msg=key)
        assert np.isnan(got[key][2]) == np.isnan(np.asarray(value)[2]), key
    assert np.isnan(got["r_hat"][2]) and np.isnan(got["ess_bulk"][2])


def test_compiled_once_per_shape():
    with _x64():
        before = chains._summary_core._cache_size()
        for seed in range(3):
            chains.summary_diagnostics(draws(seed, 4, 60))
        assert chains._summary_core._cache_size() == before + 1
        chains.summary_diagnostics(draws(0, 4, 62))
        assert chains._summary_core._cache_size() == before + 2
