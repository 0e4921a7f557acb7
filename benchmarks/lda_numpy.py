"""The online-LDA minibatch gradient estimator in plain NumPy: the baseline of
``bench_lda.py --speed``.

The same estimator as :func:`cenlmc_jax.models.lda.lda_grad_estimator` (paper 2,
appendix F.2, after Patterson & Teh 2013), written again without JAX so that the
benchmark can say what JAX's jit and vmap buy. On a minibatch ``S̃`` of ``|S̃|`` of the
``|S|`` documents, ``θ_kw = |θ̃_kw| / Σ_w |θ̃_kw|``,

    g̃_kw = (α - 1)/θ̃_kw - 1
           + (|S| / |S̃|) Σ_{d ∈ S̃} E[n_dkw / θ̃_kw - n_dk· / θ̃_k·],          (31)

the expectation over the topic assignments estimated in each document by Gibbs sweeps of

    p(z_j = k | z_{\\j}, x, θ, γ) ∝ (γ + n^{\\j}_{dk·}) θ_{k x_j}                   (32)

with the JAX code's choices: ``z`` starts from ``p(z_j = k) ∝ θ_{k x_j}``, tokens are
updated in order, each draw is the inverse CDF of a uniform (the number of entries of
the unnormalised CDF ``c`` with ``c_k <= u c_K``, capped at ``K - 1``), ``num_burnin``
sweeps are discarded and the indicators ``1{z_j = k}`` of the next ``num_kept``
averaged; ``1/θ̃`` is taken at ``max(θ̃, tiny)``; the minibatch is drawn uniformly
without replacement. The random streams differ (NumPy's ``Generator``, not JAX's keys),
so the two agree in distribution, not draw by draw. NumPy works in float64, the
benchmark's JAX runs in float32.

Two versions of the Gibbs sweeps:

* :func:`gibbs_counts_loop`: the textbook one, one document after another, one token
  after another (a Python loop over the ``Σ_d N_d`` tokens of the minibatch, each
  sweep);
* :func:`gibbs_counts_vectorised`: the documents of the minibatch advanced together on
  padded token arrays, one token position at a time (a Python loop over the ``L``
  positions of the longest document, each step a NumPy operation on ``(|S̃|, K)``
  arrays): the NumPy analogue of the JAX code's ``vmap`` over documents of a
  ``lax.scan`` over tokens, and the stronger baseline.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = [
    "topic_word",
    "grad_from_counts",
    "gibbs_counts_loop",
    "gibbs_counts_vectorised",
    "numpy_grad_estimator",
]


def topic_word(theta_tilde: np.ndarray) -> np.ndarray:
    """``θ_kw = |θ̃_kw| / Σ_w |θ̃_kw|`` for ``θ̃: (K, W)``."""
    a = np.abs(theta_tilde)
    return a / a.sum(axis=1, keepdims=True)


def grad_from_counts(
    theta_tilde: np.ndarray, counts: np.ndarray, alpha: float, scale: float
) -> np.ndarray:
    """Eq. (31) given ``counts_kw = Σ_{d ∈ S̃} E[n_dkw]``: ``(α-1)/θ̃ - 1 + scale
    (counts/θ̃ - counts_k·/θ̃_k·)``."""
    t = np.maximum(theta_tilde, np.finfo(theta_tilde.dtype).tiny)
    rows = t.sum(axis=1, keepdims=True)
    n_k = counts.sum(axis=1, keepdims=True)
    return (alpha - 1.0) / t - 1.0 + scale * (counts / t - n_k / rows)


def _draw(c: np.ndarray, u, K: int):
    """Inverse-CDF draw from unnormalised CDFs ``c: (..., K)`` with uniforms ``u:
    (...)`` (as the JAX code)."""
    return np.minimum((c <= (u * c[..., -1])[..., None]).sum(axis=-1), K - 1)


def gibbs_counts_loop(
    rng: np.random.Generator,
    theta: np.ndarray,
    docs: list[np.ndarray],
    gamma: float,
    num_burnin: int,
    num_kept: int,
) -> np.ndarray:
    """``Σ_d E[n_dkw]``: (K, W) by eq. (32), document by document, token by token
    (Python loops)."""
    K, W = theta.shape
    theta_t = np.ascontiguousarray(theta.T)  # (W, K): θ_{· w} is a row
    counts_t = np.zeros((W, K))
    for x in docs:
        x = np.asarray(x)
        n = len(x)
        if n == 0:
            continue
        cols = theta_t[x]  # (n, K)
        z = _draw(np.cumsum(cols, axis=1), rng.random(n), K)
        n_k = np.bincount(z, minlength=K).astype(float)
        acc = np.zeros((n, K))
        for sweep in range(num_burnin + num_kept):
            u = rng.random(n)
            for j in range(n):
                n_k[z[j]] -= 1.0
                c = np.cumsum((gamma + n_k) * cols[j])
                k = min(
                    int(np.searchsorted(c, u[j] * c[-1], side="right")), K - 1
                )  # #{c_k <= u c_K}
                z[j] = k
                n_k[k] += 1.0
            if sweep >= num_burnin:
                acc[np.arange(n), z] += 1.0
        np.add.at(counts_t, x, acc / num_kept)
    return counts_t.T


def gibbs_counts_vectorised(
    rng: np.random.Generator,
    theta: np.ndarray,
    tokens: np.ndarray,
    mask: np.ndarray,
    gamma: float,
    num_burnin: int,
    num_kept: int,
) -> np.ndarray:
    """``Σ_d E[n_dkw]``: (K, W) by eq. (32), the ``B`` documents of padded ``tokens,
    mask: (B, L)`` together.

    One Python iteration per token position and sweep; padding positions keep their
    assignment and count nothing.
    """
    K, W = theta.shape
    B, L = tokens.shape
    maskf = mask.astype(float)
    cols = np.ascontiguousarray(theta.T)[tokens]  # (B, L, K)
    z = _draw(np.cumsum(cols, axis=2), rng.random((B, L)), K)
    rows = np.arange(B)
    n_k = np.zeros((B, K))
    np.add.at(n_k, (rows[:, None], z), maskf)
    acc = np.zeros((B, L, K))
    for sweep in range(num_burnin + num_kept):
        u = rng.random((B, L))
        for j in range(L):
            m = maskf[:, j]
            n_k[rows, z[:, j]] -= m
            k = _draw(np.cumsum((gamma + n_k) * cols[:, j], axis=1), u[:, j], K)
            z[:, j] = np.where(mask[:, j], k, z[:, j])
            n_k[rows, z[:, j]] += m
        if sweep >= num_burnin:
            acc[rows[:, None], np.arange(L)[None, :], z] += maskf
    counts_t = np.zeros((W, K))
    np.add.at(counts_t, tokens.reshape(-1), acc.reshape(-1, K) / num_kept)
    return counts_t.T


def numpy_grad_estimator(
    tokens: np.ndarray,
    mask: np.ndarray,
    num_topics: int,
    num_words: int,
    alpha: float,
    gamma: float,
    batch_size: int = 50,
    *,
    num_burnin: int = 10,
    num_kept: int = 10,
    vectorised: bool = True,
) -> Callable[[np.random.Generator, np.ndarray], np.ndarray]:
    """The minibatch estimator of eq. (31): ``(rng, θ̃: (K·W,)) -> g̃: (K·W,)``, float64.

    tokens, mask: the padded corpus ``(D, L)`` (as
    :class:`cenlmc_jax.models.lda.Corpus`, as NumPy arrays). Draws ``batch_size`` of the
    ``D`` documents without replacement, runs the Gibbs sweeps
    (:func:`gibbs_counts_vectorised` or, ``vectorised=False``,
    :func:`gibbs_counts_loop`) and returns :func:`grad_from_counts` with ``scale = D /
    batch_size``.
    """
    tokens, mask = np.asarray(tokens), np.asarray(mask, bool)
    if tokens.ndim != 2 or tokens.shape != mask.shape:
        raise ValueError(
            f"tokens and mask must be (D, L) arrays of one shape; got {tokens.shape}, "
            f"{mask.shape}."
        )
    D = tokens.shape[0]
    if not 1 <= batch_size <= D:
        raise ValueError(f"batch_size must be in [1, {D}]; got {batch_size}.")
    if num_burnin < 0 or num_kept < 1:
        raise ValueError(
            f"need num_burnin >= 0 and num_kept >= 1; got {num_burnin}, {num_kept}."
        )
    K, W = int(num_topics), int(num_words)
    docs = [t[m] for t, m in zip(tokens, mask, strict=True)]

    def estimator(rng: np.random.Generator, position: np.ndarray) -> np.ndarray:
        theta_tilde = np.asarray(position, float).reshape(K, W)
        theta = topic_word(theta_tilde)
        idx = rng.choice(D, batch_size, replace=False)
        if vectorised:
            counts = gibbs_counts_vectorised(
                rng, theta, tokens[idx], mask[idx], gamma, num_burnin, num_kept
            )
        else:
            counts = gibbs_counts_loop(
                rng, theta, [docs[i] for i in idx], gamma, num_burnin, num_kept
            )
        return grad_from_counts(theta_tilde, counts, alpha, D / batch_size).reshape(-1)

    return estimator
