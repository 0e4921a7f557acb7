"""benchmarks/lda_numpy.py, the NumPy baseline of ``bench_lda.py --speed``, against the
exact expectation.

The benchmark's speed-up is only meaningful if the NumPy code computes the same
estimator as ``cenlmc_jax.models.lda.lda_grad_estimator``. Both are checked here against
the same thing neither can
fake: eq. (31) with the expectation over the topic assignments by enumeration on the
tiny corpus of tests/models/test_lda.py (K = 2, 6 documents of 2-4 tokens), with
z-scores against the standard error over independent runs (MCSE).
"""

import sys
from pathlib import Path

import numpy as np
import pytest
from test_lda import (
    TINY_THETA_TILDE,
    TINY_W,
    Z_BOUND,
    _exact_grad,
    _sorted_docs,
    _tiny_corpus,
    _zscores,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import lda_numpy  # noqa: E402

ALPHA, GAMMA = 0.5, 0.3  # test_lda.HYPERS


def _np_corpus():
    c = _tiny_corpus()
    return np.asarray(c.tokens), np.asarray(c.mask)


def _runs(est, num_runs, seed):
    rng = np.random.default_rng(seed)
    position = TINY_THETA_TILDE.reshape(-1)
    return np.stack([est(rng, position) for _ in range(num_runs)])


@pytest.mark.parametrize("vectorised", [True, False])
def test_numpy_estimator_matches_the_exact_expectation_over_z(vectorised):
    tokens, mask = _np_corpus()
    # all 6 documents (no minibatch noise): the only error is Gibbs' (20 burn-in sweeps
    # of <= 4 tokens, K = 2: the bias is far below the MCSE of 400 runs, as in test_lda)
    est = lda_numpy.numpy_grad_estimator(
        tokens,
        mask,
        2,
        TINY_W,
        ALPHA,
        GAMMA,
        batch_size=6,
        num_burnin=20,
        num_kept=20,
        vectorised=vectorised,
    )
    z = _zscores(_runs(est, 400, seed=11 + vectorised), _exact_grad(_sorted_docs()))
    assert np.all(np.abs(z) < Z_BOUND), (
        z
    )  # 6 coordinates; Z_BOUND: Bonferroni for up to 12 (test_lda)


def test_numpy_minibatch_scaling_is_unbiased():
    tokens, mask = _np_corpus()
    # 2 of 6 documents a call, scaled by 6/2: unbiased for the full-data gradient
    est = lda_numpy.numpy_grad_estimator(
        tokens, mask, 2, TINY_W, ALPHA, GAMMA, batch_size=2, num_burnin=20, num_kept=5
    )
    g = _runs(est, 1000, seed=13)
    z = _zscores(g, _exact_grad(_sorted_docs()))
    assert np.all(np.abs(z) < Z_BOUND), z
    # the check sees the 6/2 factor: without it the mean would be many standard errors
    # away
    assert np.max(np.abs(_zscores(g, _exact_grad(_sorted_docs(), scale=1 / 3)))) > 10


def test_numpy_estimator_rejects_bad_arguments():
    tokens, mask = _np_corpus()
    with pytest.raises(ValueError, match="batch_size"):
        lda_numpy.numpy_grad_estimator(
            tokens, mask, 2, TINY_W, ALPHA, GAMMA, batch_size=7
        )
    with pytest.raises(ValueError, match="num_kept"):
        lda_numpy.numpy_grad_estimator(
            tokens, mask, 2, TINY_W, ALPHA, GAMMA, batch_size=2, num_kept=0
        )
    with pytest.raises(ValueError, match="tokens and mask"):
        lda_numpy.numpy_grad_estimator(
            tokens, mask[:, :1], 2, TINY_W, ALPHA, GAMMA, batch_size=2
        )
