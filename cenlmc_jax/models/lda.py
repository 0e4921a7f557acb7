"""Online latent Dirichlet allocation for the stochastic-gradient samplers.

Paper 2, appendix F.2.

Ma, Chen & Fox (the "complete recipe" / "unifying framework" paper), appendix
F.2, after Patterson & Teh (2013), *Stochastic gradient Riemannian Langevin
dynamics on the probability simplex*. Nothing here is a sampler: this module
gives a minibatch gradient estimator ``(rng_key, θ̃) -> g̃`` that the library's
``cj.sgld``, ``cj.sghmc``, ``cj.sgrld`` and ``cj.sgrhmc`` run unchanged, the
metric and step-size schedule of the paper, the mirroring step, and the
held-out perplexity by document completion.

**Model.** ``K`` topics over ``W`` words, ``D = |S|`` training documents.
Document ``d`` has topic proportions ``η_d ~ Dir(γ)`` and tokens
``x_dj | z_dj = k ~ Cat(θ_k)``. The topic-word distributions are written in the
*expanded-mean* parameterisation (Patterson & Teh)::

    θ_kw = |θ̃_kw| / Σ_w' |θ̃_kw'|,        θ̃_kw ~ Gamma(α, 1)  (so θ_k ~ Dir(α)),

and the samplers move ``θ̃ ∈ R^{K·W}`` (the flat position, row-major ``(K, W)``).

**Stochastic gradient** (paper 2 eq. (31), after Patterson & Teh): on a
minibatch ``S̃`` of documents, with ``θ̃_k· = Σ_w θ̃_kw``::

    ∂ log p(θ̃ | x, α, γ) / ∂θ̃_kw ≈ (α - 1)/θ̃_kw - 1                        (31)
        + (|S| / |S̃|) Σ_{d ∈ S̃} E_{z^(d) | x^(d), θ, γ} [ n_dkw / θ̃_kw
                                                        - n_dk· / θ̃_k· ],

``n_dkw`` the number of tokens of word ``w`` assigned to topic ``k`` in document
``d``. With the exact expectation and ``S̃ = S`` this is the exact gradient of
the log posterior (Fisher's identity: ``∂ log θ_kx / ∂θ̃_kw = 1{x = w}/θ̃_kw -
1/θ̃_k·``); over a uniformly drawn ``S̃`` (without replacement, Floyd's
algorithm, :func:`cenlmc_jax.gradients.estimators.floyd_subset`) it is unbiased
for it.

**The expectation over z** is estimated in each document by Gibbs sweeps of
the collapsed conditional (paper 2 eq. (32); η_d integrated out)

    p(z_j = k | z_{\\j}, x, θ, γ) ∝ (γ + n^{\\j}_{dk·}) θ_{k x_j},          (32)

tokens updated in order; ``z`` starts from ``p(z_j = k) ∝ θ_{k x_j}`` (eq. (32)
with no other assignments), ``num_burnin`` sweeps are discarded and the
indicator counts ``1{z_j = k}`` of the next ``num_kept`` sweeps averaged. The
documents are padded token arrays (:class:`Corpus`); one document's sweeps are a
``lax.scan`` over its tokens and the minibatch is ``vmap``-ed over documents.
The Gibbs average is consistent in ``num_kept`` (bias from the finite burn-in,
which vanishes geometrically in ``num_burnin``); the minibatch scaling itself
is unbiased.

**Metric** (paper 2 F.2, after Patterson & Teh): ``G(θ̃)^{-1} = diag(θ̃)``
(:func:`inv_metric`), for SGRLD and SGRHMC. With it the SGRLD drift of the
recipe is ``θ̃ ⊙ g̃ + Γ``, ``Γ_i = ∂_i θ̃_i = 1``::

    θ̃' = θ̃ + ε (α - θ̃ + (|S|/|S̃|) Σ_d E[n_dkw - θ_kw n_dk·]) + N(0, 2 ε θ̃),

Patterson & Teh's expanded-mean SGRLD update with their ``ε`` twice the library's
(theirs: ``ε/2`` drift, ``ε`` noise variance). Note that the likelihood depends on
``θ̃`` only through ``θ``: the posterior of each row's scale ``θ̃_k·`` is its prior
``Gamma(Wα, 1)``, so ``θ̃`` is small (``Wα = 0.43`` at ``W = 4,258``).

**Running the library's samplers** (:func:`coordinatewise`): the samplers'
``D``, ``Q``, friction and metric are scalar or elementwise diagonal here, so
one step of a ``d``-dimensional chain is ``d`` one-dimensional steps coupled
only through ``g̃``. :func:`coordinatewise` calls the estimator once per step on
the whole ``θ̃`` and ``vmap``-s the library's step, unchanged, over the
coordinates. It is needed because the library checks constant matrices as dense float64
``(d, d)`` arrays at ``init`` and on every trace (``d² ≈ 7.3·10^9`` numbers at ``d = K·W
= 85,160``).

**Mirroring** (Patterson & Teh take the absolute value of the updated ``θ̃``,
its mirror image at the boundary 0): after every step of any of the four
samplers ``θ̃ ← |θ̃|`` (:func:`mirrored`, a wrapper of the sampler object; the
inner step is the library's, unchanged). For SGHMC / SGRHMC the momentum of a coordinate
that crossed 0 is negated with it: the reflection of Hamiltonian dynamics at a wall
(Neal 2011, §5.1), so a reflected coordinate moves away from the wall.
The estimator evaluates ``1/θ̃`` at ``max(θ̃, tiny)`` (the dtype's smallest
normal number): a coordinate that underflows to 0 gives a finite gradient.

**Hyper-parameters** (paper 2 F.2): Riemannian samplers ``γ = 0.01``,
``α = 0.0001`` (:data:`RIEMANNIAN_HYPERS`); SGLD / SGHMC ``γ = 0.1``,
``α = 0.01`` (:data:`EUCLIDEAN_HYPERS`). SGRLD's step schedule
``ε_t = (a (1 + t/b))^{-c}`` (:func:`paper_schedule`); the others constant
(SGRHMC ``ε = 0.02``; SGLD ``ε = 0.01``, ``D = I``; SGHMC ``ε = 0.1``,
``C = M = I``).

**Held-out perplexity by document completion** (:func:`completion_perplexity`):
each held-out document's tokens are split in two halves with a fixed seed
(:func:`split_halves`); on the first half, ``θ`` fixed, eq. (32) gives Gibbs
draws and ``η̂_dk = mean over kept sweeps of (γ + n_dk) / (Kγ + N_d)`` (the
posterior mean of ``η_d`` given each draw); the second half is scored,

    perplexity = exp( - Σ_d Σ_{j ∈ second half} log Σ_k η̂_dk θ_{k x_j}
                      / #(second-half tokens) ).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cenlmc_jax.base import SamplingAlgorithm
from cenlmc_jax.gradients.estimators import floyd_subset
from cenlmc_jax.types import Array, GradEstimator

__all__ = [
    "Corpus",
    "LDAHypers",
    "RIEMANNIAN_HYPERS",
    "EUCLIDEAN_HYPERS",
    "corpus_from_counts",
    "split_halves",
    "topic_word",
    "gibbs_conditional",
    "expected_topic_indicators",
    "grad_from_counts",
    "expected_word_topic_counts",
    "lda_grad_estimator",
    "inv_metric",
    "paper_schedule",
    "coordinatewise",
    "mirrored",
    "completion_perplexity",
    "init_theta",
]


class Corpus(NamedTuple):
    """Documents as padded token arrays.

    Attributes:
      tokens: (D, L) int32 word ids; padding positions hold 0.
      mask: (D, L) bool, True at the document's real tokens (the first
        ``length`` positions).
    """

    tokens: Array
    mask: Array


class LDAHypers(NamedTuple):
    """Dirichlet hyper-parameters.

    Attributes:
      alpha: of the topic-word prior (the Gamma shape of ``θ̃``).
      gamma: of the document-topic prior.
    """

    alpha: float
    gamma: float


#: Paper 2 F.2 (after Patterson & Teh) for SGRLD and SGRHMC.
RIEMANNIAN_HYPERS = LDAHypers(alpha=1e-4, gamma=0.01)
#: Paper 2 F.2: the values the authors found best for SGLD and SGHMC.
EUCLIDEAN_HYPERS = LDAHypers(alpha=0.01, gamma=0.1)


def corpus_from_counts(counts: np.ndarray, max_len: int | None = None) -> Corpus:
    """A ``(D, W)`` document-word count matrix as a :class:`Corpus`.

    NumPy, outside any trace. Each document's tokens are its words repeated by
    their counts, in word order.

    Args:
      counts: the ``(D, W)`` non-negative counts.
      max_len: the padded length ``L`` (default: the longest document).

    Returns:
      The :class:`Corpus` of ``(D, L)`` arrays.

    Raises:
      ValueError: ``counts`` not a ``(D, W)`` array of non-negative counts, or a
        document longer than ``max_len``.
    """
    counts = np.asarray(counts)
    if counts.ndim != 2 or np.any(counts < 0):
        raise ValueError(
            "counts must be a (D, W) array of non-negative counts; got shape "
            f"{counts.shape}."
        )
    lengths = counts.sum(axis=1).astype(int)
    L = int(lengths.max()) if max_len is None else int(max_len)
    if lengths.max() > L:
        raise ValueError(
            f"a document has {lengths.max()} tokens, more than max_len={L}."
        )
    tokens = np.zeros((counts.shape[0], max(L, 1)), np.int32)
    for d, row in enumerate(counts):
        words = np.repeat(np.arange(counts.shape[1]), row)
        tokens[d, : len(words)] = words
    mask = np.arange(tokens.shape[1])[None, :] < lengths[:, None]
    return Corpus(jnp.asarray(tokens), jnp.asarray(mask))


def split_halves(corpus: Corpus, seed: int = 0) -> tuple[Corpus, Corpus]:
    """Document completion's split.

    Each document's tokens in a random order (``numpy`` generator ``seed``); the
    first ``n // 2`` are observed, the other ``n - n // 2`` scored.

    Args:
      corpus: the held-out :class:`Corpus`.
      seed: the NumPy seed of the order.

    Returns:
      ``(observed, scored)``, two :class:`Corpus`, each padded to its own longest
      half.
    """
    rng = np.random.default_rng(seed)
    tokens, mask = np.asarray(corpus.tokens), np.asarray(corpus.mask)
    halves = ([], [])
    for t, m in zip(tokens, mask, strict=True):
        words = rng.permutation(t[m])
        n_obs = len(words) // 2
        halves[0].append(words[:n_obs])
        halves[1].append(words[n_obs:])

    def pad(docs):
        L = max(1, max(len(w) for w in docs))
        tok = np.zeros((len(docs), L), np.int32)
        msk = np.zeros((len(docs), L), bool)
        for d, w in enumerate(docs):
            tok[d, : len(w)], msk[d, : len(w)] = w, True
        return Corpus(jnp.asarray(tok), jnp.asarray(msk))

    return pad(halves[0]), pad(halves[1])


def topic_word(theta_tilde: Array) -> Array:
    """``θ_kw = |θ̃_kw| / Σ_w |θ̃_kw|`` for ``θ̃: (K, W)``.

    Args:
      theta_tilde: the expanded-mean parameters ``θ̃``, shape ``(K, W)``.

    Returns:
      ``θ``, shape ``(K, W)``, rows summing to 1.
    """
    a = jnp.abs(theta_tilde)
    return a / jnp.sum(a, axis=-1, keepdims=True)


# ---------------------------------------------------------------------------
# Gibbs sweeps of eq. (32), one document (vmap over documents).
# ---------------------------------------------------------------------------


def gibbs_conditional(n_minus: Array, theta_col: Array, gamma: float) -> Array:
    """Eq. (32): ``p(z_j = k | z_{\\j}) = (γ + n^{\\j}_k) θ_{k x_j} / Σ_k (...)``.

    Args:
      n_minus: (K,) the document's topic counts without token ``j``.
      theta_col: (K,) ``θ_{k x_j}``.
      gamma: the document-topic hyper-parameter ``γ``.

    Returns:
      The ``(K,)`` conditional probabilities.
    """
    p = (gamma + n_minus) * theta_col
    return p / jnp.sum(p)


def _sweep(n_k: Array, z: Array, tok_theta: Array, mask: Array, u: Array, gamma: float):
    """One Gibbs sweep over the tokens in order.

    A scan carrying the topic counts ``n_k: (K,)``. z: (L,) the assignments
    before the sweep; tok_theta: (L, K) ``θ_{k x_j}``; u: (L,) uniforms
    (inverse-CDF draws). Padding positions keep their (unused) assignment and
    count nothing.
    """
    K = n_k.shape[0]

    def token(n_k, xs):
        z_j, col, m, u_j = xs
        mf = m.astype(n_k.dtype)
        n_minus = n_k - jax.nn.one_hot(z_j, K, dtype=n_k.dtype) * mf
        # unnormalised CDF of eq. (32)
        c = jnp.cumsum((gamma + n_minus) * col)
        # skips zero-mass topics
        k = jnp.minimum(jnp.sum(c <= u_j * c[-1]), K - 1).astype(z_j.dtype)
        k = jnp.where(m, k, z_j)
        return n_minus + jax.nn.one_hot(k, K, dtype=n_k.dtype) * mf, k

    return jax.lax.scan(token, n_k, (z, tok_theta, mask, u))


def expected_topic_indicators(
    rng_key: Array,
    theta: Array,
    tokens: Array,
    mask: Array,
    gamma: float,
    num_burnin: int,
    num_kept: int,
) -> tuple[Array, Array]:
    """Gibbs estimate of ``E[1{z_j = k}]`` for one document (eq. (32)).

    Args:
      rng_key: a JAX PRNG key.
      theta: the topic-word distributions ``θ``, shape ``(K, W)``, fixed.
      tokens: the document's word ids, shape ``(L,)``.
      mask: its real tokens, shape ``(L,)`` bool.
      gamma: the document-topic hyper-parameter ``γ``.
      num_burnin: sweeps discarded.
      num_kept: sweeps averaged, ``>= 1``.

    Returns:
      ``(indicators: (L, K), eta: (K,))``: the mean over the ``num_kept`` sweeps
      after ``num_burnin`` of the indicators (0 at padding) and of
      ``(γ + n_k)/(Kγ + N)`` (the posterior mean of the document's topic
      proportions given the draw).
    """
    K = theta.shape[0]
    dtype = theta.dtype
    # (L, K)
    tok_theta = theta[:, tokens].T
    key_init, key_sweeps = jax.random.split(rng_key)
    z = jax.random.categorical(key_init, jnp.log(tok_theta)).astype(jnp.int32)
    maskf = mask.astype(dtype)
    n_k = jnp.sum(jax.nn.one_hot(z, K, dtype=dtype) * maskf[:, None], axis=0)
    total = num_burnin + num_kept
    uniforms = jax.random.uniform(key_sweeps, (total, tokens.shape[0]), dtype)

    def sweep(carry, xs):
        n_k, z, acc, eta = carry
        u, keep = xs
        n_k, z = _sweep(n_k, z, tok_theta, mask, u, gamma)
        w = keep.astype(dtype)
        acc = acc + w * jax.nn.one_hot(z, K, dtype=dtype) * maskf[:, None]
        eta = eta + w * (gamma + n_k) / (K * gamma + jnp.sum(maskf))
        return (n_k, z, acc, eta), None

    keep = jnp.arange(total) >= num_burnin
    init = (n_k, z, jnp.zeros((tokens.shape[0], K), dtype), jnp.zeros((K,), dtype))
    (_, _, acc, eta), _ = jax.lax.scan(sweep, init, (uniforms, keep))
    return acc / num_kept, eta / num_kept


def expected_word_topic_counts(
    rng_key: Array,
    theta: Array,
    docs: Corpus,
    gamma: float,
    num_burnin: int,
    num_kept: int,
) -> Array:
    """``Σ_{d ∈ docs} E[n_dkw]``.

    The documents' Gibbs indicators (vmapped) scattered onto words.

    Args:
      rng_key: a JAX PRNG key.
      theta: the topic-word distributions ``θ``, shape ``(K, W)``.
      docs: the :class:`Corpus` of the documents.
      gamma: the document-topic hyper-parameter ``γ``.
      num_burnin: sweeps discarded per document.
      num_kept: sweeps averaged per document.

    Returns:
      The expected counts, shape ``(K, W)``.
    """
    keys = jax.random.split(rng_key, docs.tokens.shape[0])
    ind, _ = jax.vmap(
        expected_topic_indicators, in_axes=(0, None, 0, 0, None, None, None)
    )(keys, theta, docs.tokens, docs.mask, gamma, num_burnin, num_kept)
    K = theta.shape[0]
    return (
        jnp.zeros_like(theta).at[:, docs.tokens.reshape(-1)].add(ind.reshape(-1, K).T)
    )


def grad_from_counts(
    theta_tilde: Array, counts: Array, alpha: float, scale: float
) -> Array:
    """Eq. (31) given the expected counts ``counts_kw = Σ_{d ∈ S̃} E[n_dkw]``.

    ::

        (α - 1)/θ̃_kw - 1 + scale · (counts_kw / θ̃_kw - counts_k· / θ̃_k·),
        scale = |S| / |S̃|,

    with ``1/θ̃`` taken at ``max(θ̃, tiny)``.

    Args:
      theta_tilde: ``θ̃``, shape ``(K, W)``.
      counts: the expected counts, shape ``(K, W)``.
      alpha: the topic-word hyper-parameter ``α``.
      scale: ``|S| / |S̃|``.

    Returns:
      The gradient estimate, shape ``(K, W)``.
    """
    t = jnp.maximum(theta_tilde, jnp.finfo(theta_tilde.dtype).tiny)
    rows = jnp.sum(t, axis=1, keepdims=True)
    n_k = jnp.sum(counts, axis=1, keepdims=True)
    return (alpha - 1.0) / t - 1.0 + scale * (counts / t - n_k / rows)


def lda_grad_estimator(
    corpus: Corpus,
    num_topics: int,
    num_words: int,
    hypers: LDAHypers,
    batch_size: int = 50,
    *,
    num_burnin: int = 10,
    num_kept: int = 10,
) -> GradEstimator:
    """The minibatch estimator of eq. (31): ``(rng_key, θ̃: (K·W,)) -> g̃: (K·W,)``.

    Draws ``|S̃| = batch_size`` of the ``|S| = D`` documents without replacement,
    runs ``num_burnin + num_kept`` Gibbs sweeps of eq. (32) in each (vmapped over
    the minibatch), and returns :func:`grad_from_counts` with
    ``scale = D / batch_size``. Jittable; the corpus is closed over (on the
    device once).

    Args:
      corpus: the training :class:`Corpus` (``D`` documents).
      num_topics: ``K``.
      num_words: ``W``.
      hypers: the :class:`LDAHypers`.
      batch_size: ``|S̃|``, in ``[1, D]``.
      num_burnin: Gibbs sweeps discarded, ``>= 0``.
      num_kept: Gibbs sweeps averaged, ``>= 1``.

    Returns:
      The gradient estimator ``(rng_key, θ̃) -> g̃``, both ``(K·W,)``.

    Raises:
      ValueError: ``batch_size``, ``num_burnin`` or ``num_kept`` out of range.
    """
    D = int(corpus.tokens.shape[0])
    if not 1 <= batch_size <= D:
        raise ValueError(f"batch_size must be in [1, {D}]; got {batch_size}.")
    if num_burnin < 0 or num_kept < 1:
        raise ValueError(
            f"need num_burnin >= 0 and num_kept >= 1; got {num_burnin}, {num_kept}."
        )
    K, W = int(num_topics), int(num_words)
    scale = D / batch_size

    def grad_estimator(rng_key, position):
        theta_tilde = position.reshape(K, W)
        key_batch, key_gibbs = jax.random.split(rng_key)
        idx = floyd_subset(key_batch, D, batch_size)
        batch = Corpus(corpus.tokens[idx], corpus.mask[idx])
        counts = expected_word_topic_counts(
            key_gibbs,
            topic_word(theta_tilde),
            batch,
            hypers.gamma,
            num_burnin,
            num_kept,
        )
        return grad_from_counts(theta_tilde, counts, hypers.alpha, scale).reshape(-1)

    return grad_estimator


def inv_metric(position: Array) -> Array:
    """``G(θ̃)^{-1} = diag(θ̃)`` (paper 2 F.2), as the ``(d,)`` diagonal.

    Args:
      position: ``θ̃``, shape ``(d,)``.

    Returns:
      ``position`` itself, the diagonal.
    """
    return position


def paper_schedule(a: float, b: float, c: float):
    """SGRLD's step sizes ``ε_t = (a (1 + t/b))^{-c}`` (paper 2 F.2).

    Args:
      a: ``> 0``.
      b: ``> 0``.
      c: ``>= 0``.

    Returns:
      The schedule ``t -> ε_t`` (float32).

    Raises:
      ValueError: a parameter out of its range.
    """
    if not (a > 0 and b > 0 and c >= 0):
        raise ValueError(f"need a > 0, b > 0, c >= 0; got a={a}, b={b}, c={c}.")

    def schedule(t):
        return (a * (1.0 + jnp.asarray(t, jnp.float32) / b)) ** (-c)

    return schedule


def coordinatewise(
    make_sampler: Callable[[GradEstimator], SamplingAlgorithm],
    grad_estimator: GradEstimator,
) -> SamplingAlgorithm:
    """A library sampler run as ``d`` one-dimensional chains.

    They share one gradient estimate per step. The returned sampler takes the
    flat ``θ̃: (d,)``; its state is the library's state with a leading
    coordinate axis (``position: (d, 1)``). Each step calls ``grad_estimator``
    once on the whole ``θ̃`` and runs the library's step, unchanged,
    ``vmap``-ed over the coordinates, coordinate ``i`` given ``g̃_i`` and its own
    key (``split(key, d)``).

    This is the same Markov chain as the library's step on ``(d,)``: with a
    scalar or an elementwise diagonal ``D``, ``Q``, friction and metric (all four
    samplers here; ``G^{-1} = diag(θ̃)``), the coordinates of one step are
    coupled only through ``g̃``, and the noise is independent across
    coordinates. It exists because the library's samplers check their constant
    matrices as dense float64 ``(d, d)`` arrays (``_linalg.constant_dense``) at
    ``init`` and on every trace: ``d² ≈ 7.3·10^9`` numbers at
    ``d = K·W = 85,160``; at ``d = 1`` they cost nothing.

    Args:
      make_sampler: ``g̃_est -> SamplingAlgorithm``, builds the library's sampler
        for an estimator (``lambda est: cj.sgrld(est, schedule, inv_metric)``,
        say).
      grad_estimator: ``(rng_key, θ̃: (d,)) -> g̃: (d,)``.

    Returns:
      The :class:`~cenlmc_jax.base.SamplingAlgorithm` on ``θ̃: (d,)``.
    """

    def init(position, rng_key=None):
        position = jnp.asarray(position)
        d = position.shape[0]
        alg = make_sampler(lambda key, p: jnp.zeros_like(p))
        if rng_key is None:
            return jax.vmap(lambda p: alg.init(p))(position[:, None])
        return jax.vmap(alg.init)(position[:, None], jax.random.split(rng_key, d))

    def step(rng_key, state):
        theta = state.position[:, 0]
        key_grad, key_steps = jax.random.split(rng_key)
        g = grad_estimator(key_grad, theta)

        def one(key, s, g_i):
            return make_sampler(lambda _key, _p: g_i).step(key, s)

        return jax.vmap(one)(
            jax.random.split(key_steps, theta.shape[0]), state, g[:, None]
        )

    return SamplingAlgorithm(init, step)


def mirrored(algorithm: SamplingAlgorithm) -> SamplingAlgorithm:
    """The sampler with ``θ̃ ← |θ̃|`` after each of its steps (and at ``init``).

    Patterson & Teh's mirroring. A state with a ``momentum`` (SGHMC, SGRHMC) has
    the momentum of each coordinate that crossed 0 negated (reflection at the
    wall). The inner ``init`` and ``step`` are the library's (or
    :func:`coordinatewise`'s); infos pass through.

    Args:
      algorithm: the :class:`~cenlmc_jax.base.SamplingAlgorithm` to wrap.

    Returns:
      The mirrored :class:`~cenlmc_jax.base.SamplingAlgorithm`.
    """

    def init(position, rng_key=None):
        return algorithm.init(jnp.abs(position), rng_key)

    def step(rng_key, state):
        new, info = algorithm.step(rng_key, state)
        pos = new.position
        fields = {"position": jnp.abs(pos)}
        if hasattr(new, "momentum"):
            fields["momentum"] = jnp.where(pos < 0, -new.momentum, new.momentum)
        return new._replace(**fields), info

    return SamplingAlgorithm(init, step)


def init_theta(
    rng_key: Array, num_topics: int, num_words: int, dtype=jnp.float32
) -> Array:
    """A starting ``θ̃: (K·W,)`` with entries ``Gamma(1, 1)``.

    Every topic near uniform over words.

    Args:
      rng_key: a JAX PRNG key.
      num_topics: ``K``.
      num_words: ``W``.
      dtype: the floating dtype.

    Returns:
      ``θ̃``, shape ``(K·W,)``.
    """
    return jax.random.gamma(rng_key, 1.0, (num_topics * num_words,), dtype)


# ---------------------------------------------------------------------------
# Held-out perplexity by document completion.
# ---------------------------------------------------------------------------


def completion_log_probs(
    rng_key: Array,
    theta: Array,
    observed: Corpus,
    scored: Corpus,
    gamma: float,
    num_burnin: int,
    num_kept: int,
) -> tuple[Array, Array]:
    """Per document: ``Σ_{j scored} log Σ_k η̂_dk θ_{k x_j}``, and the scored tokens.

    ``η̂_d`` from Gibbs on the observed half with ``θ: (K, W)`` fixed
    (:func:`expected_topic_indicators`). Returns ``(log_probs: (D,), counts: (D,))``.
    """
    keys = jax.random.split(rng_key, observed.tokens.shape[0])
    _, eta = jax.vmap(
        expected_topic_indicators, in_axes=(0, None, 0, 0, None, None, None)
    )(keys, theta, observed.tokens, observed.mask, gamma, num_burnin, num_kept)
    # (D, L2): p(x_j) under η̂_d
    p = jnp.einsum("dk,kdl->dl", eta, theta[:, scored.tokens])
    logp = jnp.where(scored.mask, jnp.log(jnp.where(scored.mask, p, 1.0)), 0.0)
    return jnp.sum(logp, axis=1), jnp.sum(scored.mask, axis=1)


def completion_perplexity(
    rng_key: Array,
    theta: Array,
    observed: Corpus,
    scored: Corpus,
    gamma: float,
    num_burnin: int = 50,
    num_kept: int = 50,
) -> Array:
    """Held-out perplexity ``exp(-Σ log p(w) / #words)`` over the scored halves.

    Module docstring. Jittable, the sweep counts static
    (``jax.jit(completion_perplexity, static_argnums=(5, 6))``; ``gamma`` may be
    traced).

    Args:
      rng_key: a JAX PRNG key.
      theta: (K, W) topic-word distributions (rows sum to 1), fixed.
      observed: the observed halves (:func:`split_halves`).
      scored: the scored halves.
      gamma: the document-topic hyper-parameter ``γ``.
      num_burnin: Gibbs sweeps discarded per document.
      num_kept: Gibbs sweeps averaged per document.

    Returns:
      The scalar perplexity.
    """
    logp, n = completion_log_probs(
        rng_key, theta, observed, scored, gamma, num_burnin, num_kept
    )
    return jnp.exp(-jnp.sum(logp) / jnp.sum(n))
