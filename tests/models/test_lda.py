"""Online LDA (cenlmc_jax.models.lda): Gibbs conditional, eq. (31), minibatch scaling,
perplexity.

Exact references come from enumerating the topic assignments ``z`` of tiny documents
(``K = 2``: ``2^L`` assignments): ``p(z | x, θ, γ) ∝ Π_j θ_{z_j x_j} · Π_k Γ(γ + n_k)``
(η_d integrated out, the Dirichlet-multinomial). Monte Carlo estimates are compared with
z-scores against their standard errors across independent keys (MCSE), with a
Bonferroni-sized bound.

The `lda` package has no held-out perplexity for a given topic-word matrix (its
``loglikelihood()`` is the joint ``log p(w, z)`` of its own collapsed-Gibbs state, and
its ``transform`` is a deterministic pseudo-count iteration, not the Gibbs estimate of
eq. (32)), so the Reuters check compares against an independent token-by-token NumPy
implementation, with a topic-word matrix fitted by the `lda` package.
"""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import gammaln

import cenlmc_jax as cj
from cenlmc_jax.models import lda as L

#: z-score bound for a max over m coordinates: P(max |Z| > 4.5) <= m * 6.8e-6 (m <= 12
#: here: < 1e-4).
Z_BOUND = 4.5


def _log_joint_z(z, x, theta, gamma):
    """log p(z, x | θ, γ) up to a constant: Σ_j log θ_{z_j x_j} + Σ_k log Γ(γ + n_k)."""
    K = theta.shape[0]
    n = np.bincount(z, minlength=K)
    return np.sum(np.log(theta[z, x])) + np.sum(gammaln(gamma + n))


def _posterior_over_z(x, theta, gamma):
    """All assignments of document x and their exact posterior probabilities
    (float64)."""
    K = theta.shape[0]
    zs = np.array(list(itertools.product(range(K), repeat=len(x))))
    logw = np.array([_log_joint_z(z, x, theta, gamma) for z in zs])
    w = np.exp(logw - logw.max())
    return zs, w / w.sum()


def _exact_counts(docs, theta, gamma):
    """Σ_d E[n_dkw] by enumeration: (K, W)."""
    K, W = theta.shape
    out = np.zeros((K, W))
    for x in docs:
        zs, p = _posterior_over_z(x, theta, gamma)
        for z, pz in zip(zs, p, strict=True):
            np.add.at(out, (z, x), pz)
    return out


def _log_marginal(theta_tilde, docs, alpha, gamma):
    """log p(θ̃ | x) up to a constant, by enumeration, differentiable in θ̃ (JAX,
    float64)."""
    K = theta_tilde.shape[0]
    theta = theta_tilde / jnp.sum(theta_tilde, axis=1, keepdims=True)
    total = jnp.sum((alpha - 1.0) * jnp.log(theta_tilde) - theta_tilde)
    for x in docs:
        zs = np.array(list(itertools.product(range(K), repeat=len(x))))
        n = np.stack([np.bincount(z, minlength=K) for z in zs])
        log_dm = np.sum(
            gammaln(gamma + n), axis=1
        )  # the z-dependent part of the Dirichlet-multinomial
        terms = jnp.sum(jnp.log(theta[zs, np.asarray(x)[None, :]]), axis=1) + log_dm
        total = total + jax.scipy.special.logsumexp(terms)
    return total


# A tiny corpus: K = 2 topics, W = 3 words, 6 documents of 2-4 tokens (at most 16
# assignments each).
TINY_DOCS = [[0, 0, 1], [2, 2], [0, 1, 2, 2], [1, 1, 0], [2, 0], [0, 2, 1, 1]]
TINY_W = 3
TINY_THETA_TILDE = np.array([[3.0, 1.5, 0.5], [0.4, 1.0, 2.6]])
HYPERS = L.LDAHypers(alpha=0.5, gamma=0.3)


def _tiny_corpus(docs=TINY_DOCS):
    counts = np.zeros((len(docs), TINY_W), int)
    for d, x in enumerate(docs):
        np.add.at(counts[d], x, 1)
    return L.corpus_from_counts(counts)


def _sorted_docs(docs=TINY_DOCS):
    """The token order corpus_from_counts uses (words in order): the same multiset per
    document."""
    return [sorted(x) for x in docs]


def test_gibbs_conditional_matches_brute_force():
    rng = np.random.default_rng(0)
    K, W, gamma = 3, 4, 0.3
    theta = rng.dirichlet(np.ones(W), size=K)
    x = np.array([0, 3, 1, 1, 2])
    z = np.array([2, 0, 1, 2, 0])
    for j in range(len(x)):
        logw = []
        for k in range(K):
            zk = z.copy()
            zk[j] = k
            logw.append(_log_joint_z(zk, x, theta, gamma))
        brute = np.exp(np.array(logw) - max(logw))
        brute /= brute.sum()
        n_minus = np.bincount(np.delete(z, j), minlength=K).astype(np.float32)
        got = L.gibbs_conditional(
            jnp.asarray(n_minus), jnp.asarray(theta[:, x[j]], jnp.float32), gamma
        )
        # float32: a product of two numbers and a normalisation, ~1e-7 relative each;
        # 1e-5 leaves 100x room
        np.testing.assert_allclose(np.asarray(got), brute, rtol=1e-5)


def test_eq31_with_exact_expectation_is_the_gradient_of_the_log_posterior():
    docs = TINY_DOCS
    with jax.enable_x64(True):
        tt = jnp.asarray(TINY_THETA_TILDE)
        theta = np.asarray(TINY_THETA_TILDE / TINY_THETA_TILDE.sum(1, keepdims=True))
        counts = jnp.asarray(_exact_counts(docs, theta, HYPERS.gamma))
        got = L.grad_from_counts(tt, counts, HYPERS.alpha, 1.0)
        want = jax.jit(
            jax.grad(lambda t: _log_marginal(t, docs, HYPERS.alpha, HYPERS.gamma))
        )(tt)
        # float64 throughout; the two sides are sums of ~20 terms of size <= 10: 1e-10
        # is rounding only
        np.testing.assert_allclose(
            np.asarray(got), np.asarray(want), rtol=1e-10, atol=1e-10
        )


def _estimates(est, num_keys, seed):
    keys = jax.random.split(jax.random.key(seed), num_keys)
    position = jnp.asarray(TINY_THETA_TILDE.reshape(-1), jnp.float32)
    # lax.map, not vmap: the estimator vmaps over documents already, and XLA compiles a
    # vmap of it slowly
    return np.asarray(
        jax.jit(lambda ks: jax.lax.map(lambda k: est(k, position), ks))(keys),
        np.float64,
    )


def _exact_grad(docs, scale=1.0):
    """Eq. (31) with the exact expectation over all documents, the count terms times
    ``scale``."""
    theta = TINY_THETA_TILDE / TINY_THETA_TILDE.sum(1, keepdims=True)
    counts = _exact_counts(docs, theta, HYPERS.gamma)
    with jax.enable_x64(True):
        return np.asarray(
            L.grad_from_counts(
                jnp.asarray(TINY_THETA_TILDE), jnp.asarray(counts), HYPERS.alpha, scale
            )
        ).reshape(-1)


def _zscores(samples, exact):
    se = samples.std(axis=0, ddof=1) / math.sqrt(samples.shape[0])
    return (samples.mean(axis=0) - exact) / se


def test_gibbs_gradient_estimator_matches_the_exact_expectation_over_z():
    corpus = _tiny_corpus()
    # |S~| = |S|: no minibatch noise; the only error is Gibbs' (burn-in 20 sweeps of <=
    # 4 tokens, K = 2: the chain forgets its start within a few sweeps, the bias is far
    # below the MCSE of 400 runs)
    est = L.lda_grad_estimator(
        corpus, 2, TINY_W, HYPERS, batch_size=len(TINY_DOCS), num_burnin=20, num_kept=20
    )
    g = _estimates(est, 400, seed=1)
    z = _zscores(g, _exact_grad(_sorted_docs()))
    assert np.all(np.abs(z) < Z_BOUND), (
        z
    )  # 6 coordinates, Z_BOUND (Bonferroni, module constant)


def test_minibatch_scaling_is_unbiased():
    corpus = _tiny_corpus()
    # 2 of 6 documents per call, scaled by 6/2: unbiased for the full-data gradient
    # (exact expectation)
    est = L.lda_grad_estimator(
        corpus, 2, TINY_W, HYPERS, batch_size=2, num_burnin=20, num_kept=5
    )
    g = _estimates(est, 1000, seed=2)
    z = _zscores(g, _exact_grad(_sorted_docs()))
    assert np.all(np.abs(z) < Z_BOUND), z
    # the test can see the scaling: the mean is many standard errors from what an
    # estimator without the 6/2 factor would be unbiased for (the count terms a third of
    # the full-data ones)
    assert np.max(np.abs(_zscores(g, _exact_grad(_sorted_docs(), scale=1 / 3)))) > 10


def test_split_halves_partitions_each_document():
    corpus = _tiny_corpus()
    obs, sc = L.split_halves(corpus, seed=3)
    for d, x in enumerate(_sorted_docs()):
        a = np.asarray(obs.tokens[d])[np.asarray(obs.mask[d])]
        b = np.asarray(sc.tokens[d])[np.asarray(sc.mask[d])]
        assert len(a) == len(x) // 2 and len(b) == len(x) - len(x) // 2
        assert sorted(np.concatenate([a, b]).tolist()) == x


def _one_doc(x, L_pad=None):
    L_pad = L_pad or len(x)
    tok = np.zeros((1, L_pad), np.int32)
    tok[0, : len(x)] = x
    return L.Corpus(jnp.asarray(tok), jnp.asarray(np.arange(L_pad)[None] < len(x)))


def test_perplexity_hand_computed_cases():
    perp = jax.jit(L.completion_perplexity, static_argnums=(4, 5, 6))
    key = jax.random.key(0)
    # K = 1: η = 1 whatever the observed half; perplexity = exp(-mean log θ_w) over the
    # scored half
    theta1 = jnp.asarray([[0.1, 0.2, 0.3, 0.4]])
    got = perp(key, theta1, _one_doc([0, 1]), _one_doc([2, 3, 3], L_pad=5), 0.5, 3, 4)
    want = math.exp(-(math.log(0.3) + 2 * math.log(0.4)) / 3)
    assert (
        abs(float(got) - want) < 1e-5 * want
    )  # float32 rounding of three logs and an exp
    # K = 2, disjoint supports: z is determined by the words; observed [0, 1, 2] gives n
    # = (2, 1), η = ((γ + 2)/(2γ + 3), (γ + 1)/(2γ + 3)); scored [1, 3]: p = 0.5 η_0 and
    # 0.75 η_1
    g = 0.2
    theta2 = jnp.asarray([[0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.25, 0.75]])
    got = perp(key, theta2, _one_doc([0, 1, 2]), _one_doc([1, 3]), g, 2, 3)
    eta = np.array([g + 2, g + 1]) / (2 * g + 3)
    want = math.exp(-(math.log(0.5 * eta[0]) + math.log(0.75 * eta[1])) / 2)
    assert (
        abs(float(got) - want) < 1e-5 * want
    )  # the same: no Monte Carlo error in this case


def test_completion_eta_matches_enumeration():
    # η̂ from Gibbs on an observed half vs the exact posterior mean Σ_z p(z | x) (γ +
    # n)/(Kγ + N)
    x = [0, 1, 2, 2]
    theta = TINY_THETA_TILDE / TINY_THETA_TILDE.sum(1, keepdims=True)
    zs, p = _posterior_over_z(np.array(x), theta, HYPERS.gamma)
    n = np.stack([np.bincount(z, minlength=2) for z in zs])
    exact = p @ ((HYPERS.gamma + n) / (2 * HYPERS.gamma + len(x)))
    keys = jax.random.split(jax.random.key(4), 400)
    doc = _one_doc(x, L_pad=6)  # padding must not count
    f = jax.jit(
        lambda ks: jax.lax.map(
            lambda k: L.expected_topic_indicators(
                k,
                jnp.asarray(theta, jnp.float32),
                doc.tokens[0],
                doc.mask[0],
                HYPERS.gamma,
                20,
                20,
            )[1],
            ks,
        )
    )
    eta = f(keys)
    z = _zscores(np.asarray(eta, np.float64), exact)
    assert np.all(np.abs(z) < Z_BOUND), (
        z
    )  # 2 coordinates (they sum to 1: one independent)


def _numpy_completion_logprob(rng, theta, obs_docs, sc_docs, gamma, burnin, kept):
    """Document completion, token by token in NumPy (independent of the JAX code): Σ log
    p over scored tokens."""
    K = theta.shape[0]
    total = 0.0
    for x, y in zip(obs_docs, sc_docs, strict=True):
        p0 = theta[:, x].T
        z = (
            np.array([rng.choice(K, p=q / q.sum()) for q in p0])
            if len(x)
            else np.zeros(0, int)
        )
        n = np.bincount(z, minlength=K).astype(float)
        eta = np.zeros(K)
        for sweep in range(burnin + kept):
            for j, w in enumerate(x):
                n[z[j]] -= 1
                q = (gamma + n) * theta[:, w]
                z[j] = rng.choice(K, p=q / q.sum())
                n[z[j]] += 1
            if sweep >= burnin:
                eta += (gamma + n) / (K * gamma + len(x))
        eta /= kept
        total += np.sum(np.log(eta @ theta[:, y]))
    return total


def test_perplexity_on_reuters_matches_an_independent_numpy_implementation():
    lda = pytest.importorskip("lda")
    import logging

    logging.getLogger("lda").setLevel(logging.WARNING)
    X = np.asarray(lda.datasets.load_reuters())
    model = lda.LDA(n_topics=5, n_iter=30, random_state=1).fit(X[:100])
    theta = np.asarray(model.topic_word_, np.float64)
    obs, sc = L.split_halves(
        L.corpus_from_counts(X[380:384]), seed=0
    )  # 4 documents the fit did not see
    gamma, burnin, kept = 0.1, 5, 5
    # 30 independent JAX runs: the 4 documents repeated 30 times in one call (each copy
    # its own key)
    reps = 30
    tile = lambda c: L.Corpus(
        jnp.tile(c.tokens, (reps, 1)), jnp.tile(c.mask, (reps, 1))
    )
    f = jax.jit(L.completion_log_probs, static_argnums=(4, 5, 6))
    logp, _ = f(
        jax.random.key(5),
        jnp.asarray(theta, jnp.float32),
        tile(obs),
        tile(sc),
        gamma,
        burnin,
        kept,
    )
    jax_totals = np.asarray(logp, np.float64).reshape(reps, -1).sum(axis=1)
    docs = [
        np.asarray(t)[np.asarray(m)] for t, m in zip(obs.tokens, obs.mask, strict=True)
    ]
    scored = [
        np.asarray(t)[np.asarray(m)] for t, m in zip(sc.tokens, sc.mask, strict=True)
    ]
    np_total = _numpy_completion_logprob(
        np.random.default_rng(6), theta, docs, scored, gamma, burnin, kept
    )
    # the NumPy run is one draw of the same estimator: its difference from the mean of
    # 30 JAX runs has variance s² (1 + 1/30), s the JAX runs' standard deviation
    s = jax_totals.std(ddof=1)
    assert abs(np_total - jax_totals.mean()) < Z_BOUND * s * math.sqrt(1 + 1 / 30), (
        np_total,
        jax_totals.mean(),
        s,
    )


def _synthetic_corpus(seed, num_docs, length, K=2, W=20):
    """Documents from an LDA whose topics sit on disjoint halves of the vocabulary
    (numpy seed)."""
    rng = np.random.default_rng(seed)
    theta = np.zeros((K, W))
    for k in range(K):
        theta[k, k * W // K : (k + 1) * W // K] = rng.dirichlet(np.ones(W // K))
    counts = np.zeros((num_docs, W), int)
    for d in range(num_docs):
        eta = rng.dirichlet(np.full(K, 0.5))
        z = rng.choice(K, size=length, p=eta)
        for k in z:
            counts[d, rng.choice(W, p=theta[k])] += 1
    return counts, theta


def test_library_samplers_run_the_estimator_and_beat_a_uniform_model():
    counts, theta_true = _synthetic_corpus(7, 90, 30)
    K, W = theta_true.shape
    train = L.corpus_from_counts(counts[:60])
    obs, sc = L.split_halves(L.corpus_from_counts(counts[60:]), seed=0)
    hypers = L.RIEMANNIAN_HYPERS
    est = L.lda_grad_estimator(
        train, K, W, hypers, batch_size=20, num_burnin=5, num_kept=5
    )
    perp = jax.jit(L.completion_perplexity, static_argnums=(4, 5, 6))
    truth = float(
        perp(
            jax.random.key(3),
            jnp.asarray(theta_true, jnp.float32),
            obs,
            sc,
            hypers.gamma,
            20,
            20,
        )
    )
    makers = {
        "sgrld": lambda e: cj.sgrld(
            e, L.paper_schedule(10.0, 1000.0, 0.6), L.inv_metric
        ),
        "sgrhmc": lambda e: cj.sgrhmc(e, 0.02, L.inv_metric),
    }
    results = {}
    for name, make in makers.items():
        alg = L.mirrored(L.coordinatewise(make, est))
        state = alg.init(
            L.init_theta(jax.random.key(0), K, W),
            jax.random.key(1) if "hmc" in name else None,
        )

        @jax.jit
        def run(state, key, alg=alg):
            return jax.lax.scan(
                lambda s, k: (alg.step(k, s)[0], None),
                state,
                jax.random.split(key, 100),
            )[0]

        state = run(state, jax.random.key(2))
        assert np.all(np.asarray(state.position) >= 0)  # mirrored
        assert np.all(np.isfinite(np.asarray(state.position)))
        results[name] = float(
            perp(
                jax.random.key(3),
                L.topic_word(state.position.reshape(K, W)),
                obs,
                sc,
                hypers.gamma,
                20,
                20,
            )
        )
    # a uniform model scores every token 1/W (perplexity W = 20); the generating model
    # scores `truth` (12.4 here; 10.1-12.4 for generator seeds 7-9). 100 steps (2,000
    # documents seen) must get at least halfway, below (W + truth)/2 = 16.2: a sampler
    # that learned nothing stays near W. Measured for seeds 7-9: SGRLD 11.8-14.2, SGRHMC
    # 10.8-12.4 against bounds 15.0-16.2
    bound = 0.5 * (W + truth)
    assert results["sgrld"] < bound and results["sgrhmc"] < bound, (results, truth)


def test_estimator_runs_under_jit_and_vmap_over_keys():
    # the estimator (itself a vmap over documents) vmapped over 400 keys in one jitted
    # program (the tests above use lax.map): the same z-test against the exact
    # expectation over z as
    # test_gibbs_gradient_estimator_matches_the_exact_expectation_over_z. (The
    # perplexity's jit and its vmap over documents are in the perplexity tests; a vmap
    # over keys of it compiles in ~6 s CPU more, left out for time.)
    corpus = _tiny_corpus()
    est = L.lda_grad_estimator(
        corpus, 2, TINY_W, HYPERS, batch_size=len(TINY_DOCS), num_burnin=20, num_kept=20
    )
    keys = jax.random.split(jax.random.key(9), 400)
    position = jnp.asarray(TINY_THETA_TILDE.reshape(-1), jnp.float32)
    g = np.asarray(
        jax.jit(jax.vmap(est, in_axes=(0, None)))(keys, position), np.float64
    )
    z = _zscores(g, _exact_grad(_sorted_docs()))
    assert np.all(np.abs(z) < Z_BOUND), (
        z
    )  # 6 coordinates, Z_BOUND (Bonferroni, module constant)
