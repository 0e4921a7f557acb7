"""Online LDA on the Reuters corpus with SGLD, SGHMC, SGRLD and SGRHMC (paper 2,
appendix F.2).

The `lda` package's Reuters corpus (395 documents, 4,258 words; in its wheel, nothing is
downloaded) is split 80/20 into training and held-out documents (numpy seed 0). Each
sampler is the library's own (``cj.sgld``, ``cj.sghmc``, ``cj.sgrld``, ``cj.sgrhmc``)
running the minibatch estimator of ``cenlmc_jax.models.lda`` (eq. (31), minibatches of
50 documents, Gibbs sweeps of eq. (32)), wrapped in ``mirrored`` (``θ̃ ← |θ̃|`` after
each step). Every ``--eval-every`` steps the held-out perplexity by document completion
is taken at the current sample. The anchor is the `lda` package's collapsed Gibbs
sampler on the same training documents, its ``topic_word_`` scored by the same
perplexity function.

    # K = 20, 40 steps per sampler: a smoke run
    python benchmarks/bench_lda.py --size small
    # K = 20, 400 steps (20,000 documents seen)
    python benchmarks/bench_lda.py --size full
    # documents/s, Gibbs share, JAX vs NumPy
    python benchmarks/bench_lda.py --speed --topics 20 50

Writes benchmarks/results/lda.{json,md} and lda.png; ``--speed`` writes
lda_speed.{json,md} (the NumPy baseline is benchmarks/lda_numpy.py, the same estimator).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import base_parser, write_results  # noqa: E402

import cenlmc_jax as cj  # noqa: E402
from cenlmc_jax.models import lda as L  # noqa: E402

SAMPLERS = ("SGLD", "SGHMC", "SGRLD", "SGRHMC")
#: paper 2 F.2's step sizes; SGRLD's schedule constants are not stated there (it keeps
#: those of Patterson & Teh, whose text is not at hand): a, b, c below are ours (see the
#: notes).
STEP = {"SGLD": 0.01, "SGHMC": 0.1, "SGRHMC": 0.02}
SGRLD_SCHEDULE = (10.0, 1000.0, 0.6)
# steps per sampler, evaluations, Gibbs sweeps (burn-in, kept) per gradient, lda-package
# iterations
SIZES = {
    "small": dict(topics=20, steps=40, eval_every=20, burnin=5, kept=5, lda_iter=200),
    "full": dict(
        topics=20, steps=400, eval_every=25, burnin=10, kept=10, lda_iter=1500
    ),
}
BATCH = 50
PERPLEXITY_SWEEPS = (
    50,
    50,
)  # burn-in, kept: Gibbs on each held-out document's observed half


def load_split(seed: int = 0, test_fraction: float = 0.2):
    """Reuters count matrix split by documents; returns (X_train, train Corpus,
    observed, scored, vocab)."""
    import lda

    X = np.asarray(lda.datasets.load_reuters())
    vocab = list(lda.datasets.load_reuters_vocab())
    perm = np.random.default_rng(seed).permutation(X.shape[0])
    n_test = int(round(test_fraction * X.shape[0]))
    test, train = perm[:n_test], perm[n_test:]
    observed, scored = L.split_halves(L.corpus_from_counts(X[test]), seed)
    return X[train], L.corpus_from_counts(X[train]), observed, scored, vocab


def maker(name: str):
    """``estimator -> SamplingAlgorithm``: the library's sampler ``name`` with the
    paper's steps and metric."""
    if name == "SGLD":
        return lambda e: cj.sgld(e, STEP["SGLD"])
    if name == "SGHMC":
        return lambda e: cj.sghmc(
            e, STEP["SGHMC"], friction=1.0, blowup_factor=float("inf")
        )
    if name == "SGRLD":
        return lambda e: cj.sgrld(e, L.paper_schedule(*SGRLD_SCHEDULE), L.inv_metric)
    return lambda e: cj.sgrhmc(e, STEP["SGRHMC"], L.inv_metric)


def hypers_of(name: str) -> L.LDAHypers:
    """Paper 2 F.2: the Riemannian samplers' alpha, gamma, or those found best for SGLD
    / SGHMC."""
    return L.RIEMANNIAN_HYPERS if name in ("SGRLD", "SGRHMC") else L.EUCLIDEAN_HYPERS


def build(name: str, train: L.Corpus, K: int, W: int, burnin: int, kept: int):
    """The mirrored library sampler for ``name`` and the hyper-parameters its posterior
    uses."""
    hypers = hypers_of(name)
    est = L.lda_grad_estimator(
        train, K, W, hypers, BATCH, num_burnin=burnin, num_kept=kept
    )
    return L.mirrored(L.coordinatewise(maker(name), est)), hypers


def run_sampler(name, train, observed, scored, K, W, size, seed=0):
    """Steps in jitted chunks of ``eval_every``; perplexity after each. Returns a dict
    of the curve."""
    cfg = SIZES[size]
    alg, hypers = build(name, train, K, W, cfg["burnin"], cfg["kept"])
    key_init, key_mom, key_run, key_perp = jax.random.split(jax.random.key(seed), 4)
    state = alg.init(
        L.init_theta(key_init, K, W), key_mom if name in ("SGHMC", "SGRHMC") else None
    )

    @jax.jit
    def chunk(state, key):
        def body(s, k):
            s, info = alg.step(k, s)
            return s, info.diverged

        return jax.lax.scan(body, state, jax.random.split(key, cfg["eval_every"]))

    perplexity = jax.jit(L.completion_perplexity, static_argnums=(5, 6))
    docs, perps, flagged = [], [], 0
    sampling_s = 0.0
    chunk_keys = jax.random.split(key_run, cfg["steps"] // cfg["eval_every"])
    for i, k in enumerate(chunk_keys):
        t0 = time.perf_counter()
        state, diverged = chunk(state, k)
        jax.block_until_ready(state)
        sampling_s += time.perf_counter() - t0
        flagged += int(np.sum(np.asarray(diverged)))
        theta = L.topic_word(state.position.reshape(K, W))
        p = float(
            perplexity(
                key_perp, theta, observed, scored, hypers.gamma, *PERPLEXITY_SWEEPS
            )
        )
        docs.append((i + 1) * cfg["eval_every"] * BATCH)
        perps.append(p)
        print(
            f"  {name}: {docs[-1]:6d} documents seen, perplexity {p:8.1f}", flush=True
        )
    return dict(
        docs_seen=docs,
        perplexity=perps,
        wall_s=sampling_s,
        flagged_steps=flagged,
        theta=np.asarray(L.topic_word(state.position.reshape(K, W))),
        gamma=hypers.gamma,
    )


def lda_anchor(X_train, observed, scored, K, n_iter, seed=0):
    """The `lda` package's collapsed Gibbs (alpha = 0.1, eta = 0.01, its defaults),
    scored by the same function."""
    import logging

    import lda

    logging.getLogger("lda").setLevel(logging.WARNING)
    t0 = time.perf_counter()
    model = lda.LDA(n_topics=K, n_iter=n_iter, alpha=0.1, eta=0.01, random_state=seed)
    model.fit(X_train)
    wall = time.perf_counter() - t0
    theta = jnp.asarray(model.topic_word_, jnp.float32)
    perp = float(
        jax.jit(L.completion_perplexity, static_argnums=(5, 6))(
            jax.random.key(seed), theta, observed, scored, 0.1, *PERPLEXITY_SWEEPS
        )
    )
    return dict(
        perplexity=perp, wall_s=wall, n_iter=n_iter, theta=np.asarray(model.topic_word_)
    )


def top_words(theta, vocab, n_topics=8, n_words=7, seed=0):
    """The ``n_words`` heaviest words of ``n_topics`` topics drawn at random (numpy
    seed), as rows."""
    pick = np.sort(
        np.random.default_rng(seed).choice(theta.shape[0], n_topics, replace=False)
    )
    return [(int(k), [vocab[w] for w in np.argsort(-theta[k])[:n_words]]) for k in pick]


def uniform_perplexity(W):
    """A uniform model over the vocabulary scores every token at 1/W: perplexity W."""
    return float(W)


def plot(results, anchor, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in SAMPLERS:
        r = results[name]
        ax.plot(r["docs_seen"], r["perplexity"], marker="o", ms=3, label=name)
    ax.axhline(
        anchor["perplexity"],
        color="k",
        ls="--",
        lw=1,
        label="lda package (collapsed Gibbs)",
    )
    ax.set_xlabel("documents seen")
    ax.set_ylabel("held-out perplexity")
    ax.set_yscale("log")
    ax.set_title(f"Online LDA on Reuters (K = {results['SGRHMC']['theta'].shape[0]})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# --------------------------------------------------------------------------------------
# --speed: documents per second, the share of the Gibbs sweeps, JAX against NumPy (issue
# 15 item 5).
# --------------------------------------------------------------------------------------

SPEED_SWEEPS = {
    "full": (10, 10),
    "quick": (2, 2),
}  # burn-in, kept: the experiment's full size, or a smoke run


def _timed(fn, *args):
    """(wall s, process CPU s, output) of one blocked call."""
    c0, t0 = time.process_time(), time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return time.perf_counter() - t0, time.process_time() - c0, out


def _fitted_theta(X_train, K, seed=0):
    """A realistic ``θ̃``: the `lda` package's topics after 50 collapsed-Gibbs
    iterations (rows sum to 1)."""
    import logging

    import lda

    logging.getLogger("lda").setLevel(
        logging.ERROR
    )  # "all zero column": words only in held-out documents
    return np.asarray(
        lda.LDA(n_topics=K, n_iter=50, random_state=seed).fit(X_train).topic_word_,
        np.float64,
    )


def _stats(xs):
    return {
        "median": float(np.median(xs)),
        "min": float(np.min(xs)),
        "max": float(np.max(xs)),
        "all": list(xs),
    }


def estimator_vs_numpy(train, theta, K, W, sweeps, repeats, loop_repeats):
    """The JAX estimator (jitted, float32) against lda_numpy's two versions (float64),
    interleaved repeats.

    Each repeat times one call of each, at the same ``θ̃`` and the same sweeps (a fresh
    minibatch a call). Returns per implementation the wall/CPU times and, per repeat,
    the ratio NumPy / JAX.
    """
    import lda_numpy

    hyp = L.RIEMANNIAN_HYPERS
    est = jax.jit(
        L.lda_grad_estimator(
            train, K, W, hyp, BATCH, num_burnin=sweeps[0], num_kept=sweeps[1]
        )
    )
    tok, msk = np.asarray(train.tokens), np.asarray(train.mask)
    nps = {
        v: lda_numpy.numpy_grad_estimator(
            tok,
            msk,
            K,
            W,
            hyp.alpha,
            hyp.gamma,
            BATCH,
            num_burnin=sweeps[0],
            num_kept=sweeps[1],
            vectorised=v == "numpy vectorised",
        )
        for v in ("numpy vectorised", "numpy loop")
    }
    pos32, pos64 = jnp.asarray(theta.reshape(-1), jnp.float32), theta.reshape(-1)
    first = _timed(est, jax.random.key(0), pos32)[0]
    rng = np.random.default_rng(0)
    times = {"jax": [], "numpy vectorised": [], "numpy loop": []}
    for r in range(repeats):
        times["jax"].append(_timed(est, jax.random.key(r + 1), pos32))
        times["numpy vectorised"].append(_timed(nps["numpy vectorised"], rng, pos64))
        if r < loop_repeats:
            times["numpy loop"].append(_timed(nps["numpy loop"], rng, pos64))
    out = {"jax_first_call_s": first}
    for name, ts in times.items():
        wall = [t[0] for t in ts]
        out[name] = {
            "wall_s": _stats(wall),
            "cpu_s": _stats([t[1] for t in ts]),
            "docs_per_s": BATCH / float(np.median(wall)),
        }
        if name != "jax":
            out[name]["ratio_to_jax"] = _stats(
                [t[0] / j[0] for t, j in zip(ts, times["jax"], strict=False)]
            )
            out[name]["cpu_ratio_to_jax"] = _stats(
                [t[1] / j[1] for t, j in zip(ts, times["jax"], strict=False)]
            )
    return out


def sampler_speed(name, train, theta, K, W, sweeps, repeats):
    """One sampler's jitted step (documents/s) and the shares of its time: Gibbs sweeps,
    sampler update, rest.

    Three programs, timed in interleaved repeats: the whole step (estimator + update,
    mirrored); the Gibbs sweeps alone (:func:`L.expected_word_topic_counts` on a
    minibatch of ``BATCH`` documents); the sampler update alone (the same step with the
    estimator replaced by ``θ̃ -> -θ̃``, no Gibbs). The rest (minibatch gather, scatter
    of the counts, eq. (31)) is ``1 -`` the two shares.
    """
    alg, hyp = build(name, train, K, W, *sweeps)
    update = L.mirrored(L.coordinatewise(maker(name), lambda key, p: -p))
    pos = jnp.asarray(theta.reshape(-1), jnp.float32)
    state = alg.init(pos, jax.random.key(1) if "HMC" in name else None)
    step, upd = jax.jit(alg.step), jax.jit(update.step)
    batch = L.Corpus(train.tokens[:BATCH], train.mask[:BATCH])
    gibbs = jax.jit(
        lambda k: L.expected_word_topic_counts(
            k, jnp.asarray(theta, jnp.float32), batch, hyp.gamma, *sweeps
        )
    )
    first = {
        "step": _timed(step, jax.random.key(0), state)[0],
        "update": _timed(upd, jax.random.key(0), state)[0],
        "gibbs": _timed(gibbs, jax.random.key(0))[0],
    }
    t = {"step": [], "update": [], "gibbs": []}  # (wall, CPU) pairs
    for r in range(repeats):
        k = jax.random.key(100 + r)
        t["update"].append(_timed(upd, k, state)[:2])
        wall, cpu, (state, _) = _timed(
            step, k, state
        )  # the next repeat from the moved state
        t["step"].append((wall, cpu))
        t["gibbs"].append(_timed(gibbs, k)[:2])
    out = {"first_call_s": first}
    for i, clock in enumerate(("wall", "cpu")):
        ts = {p: [x[i] for x in v] for p, v in t.items()}
        share = {
            p: _stats([a / s for a, s in zip(ts[p], ts["step"], strict=True)])
            for p in ("gibbs", "update")
        }
        out[clock] = {
            **{f"{p}_s": _stats(v) for p, v in ts.items()},
            "share": share,
            "docs_per_s": BATCH / float(np.median(ts["step"])),
            "share_rest_median": 1.0
            - share["gibbs"]["median"]
            - share["update"]["median"],
        }
    return out


def agreement(train, theta, K, W, sweeps, runs, loop_runs, seed=0):
    """The JAX and NumPy Gibbs estimates of ``Σ_d E[n_dkw]`` on one fixed minibatch
    agree in expectation.

    Both are the same finite-sweep estimator (same start, sweep order, burn-in), so
    their means agree exactly, not only as the sweeps grow. Summaries compared: the
    per-topic totals ``n_k·`` and the per-topic counts of the minibatch's 5 most
    frequent words (``6K`` numbers), by Welch's t-test per number across independent
    runs; Bonferroni over the ``6K``. Returns the max |t| and the Bonferroni-adjusted
    smallest p for each NumPy version.
    """
    import warnings

    import lda_numpy
    from scipy import stats

    gamma = L.RIEMANNIAN_HYPERS.gamma
    idx = np.random.default_rng(seed).choice(
        train.tokens.shape[0], BATCH, replace=False
    )
    tok, msk = np.asarray(train.tokens)[idx], np.asarray(train.mask)[idx]
    top = np.argsort(-np.bincount(tok[msk], minlength=W))[:5]

    def summary(c):
        c = np.asarray(c, np.float64)
        return np.concatenate([c.sum(axis=1), c[:, top].reshape(-1)])

    batch = L.Corpus(jnp.asarray(tok), jnp.asarray(msk))
    f = jax.jit(
        lambda k: L.expected_word_topic_counts(
            k, jnp.asarray(theta, jnp.float32), batch, gamma, *sweeps
        )
    )
    jx = np.stack(
        [summary(f(k)) for k in jax.random.split(jax.random.key(seed + 1), runs)]
    )
    rng = np.random.default_rng(seed + 2)
    versions = {
        "numpy vectorised": [
            lda_numpy.gibbs_counts_vectorised(rng, theta, tok, msk, gamma, *sweeps)
            for _ in range(runs)
        ],
        "numpy loop": [
            lda_numpy.gibbs_counts_loop(
                rng,
                theta,
                [t[m] for t, m in zip(tok, msk, strict=True)],
                gamma,
                *sweeps,
            )
            for _ in range(loop_runs)
        ],
    }
    out = {"runs_jax": runs, "summaries": int(jx.shape[1])}
    for name, cs in versions.items():
        npx = np.stack([summary(c) for c in cs])
        ok = (jx.std(0) > 0) | (npx.std(0) > 0)
        # the others are the same number in every run of both (a word whose topic is
        # certain under theta~): they must be equal, up to JAX's float32 sums
        const_mismatch = int(
            np.sum(
                ~ok
                & (np.abs(jx.mean(0) - npx.mean(0)) > 1e-4 * np.maximum(1, npx.mean(0)))
            )
        )
        with (
            warnings.catch_warnings()
        ):  # scipy's precision note where one side's variance is ~0
            warnings.simplefilter("ignore", RuntimeWarning)
            res = stats.ttest_ind(jx[:, ok], npx[:, ok], equal_var=False)
        out[name] = {
            "runs": len(cs),
            "tested": int(ok.sum()),
            "constant_and_equal": int(np.sum(~ok)) - const_mismatch,
            "constant_mismatch": const_mismatch,
            "max_abs_t": float(np.max(np.abs(res.statistic))),
            "bonferroni_p": float(min(1.0, np.min(res.pvalue) * ok.sum())),
            "max_rel_diff_of_means": float(
                np.max(
                    np.abs(jx.mean(0) - npx.mean(0))[ok]
                    / np.maximum(np.abs(jx.mean(0)[ok]), 1.0)
                )
            ),
        }
    return out


def _range(st, fmt="{:.3g}"):
    return (
        f"{fmt.format(st['median'])} [{fmt.format(st['min'])}-{fmt.format(st['max'])}]"
    )


def speed_main(args):
    """``--speed``: writes benchmarks/results/lda_speed.{json,md}."""
    import os

    from _common import markdown_table

    size = "quick" if args.quick else "full"
    sweeps, repeats = SPEED_SWEEPS[size], args.repeats
    loop_repeats = min(
        repeats, 3
    )  # the token-loop NumPy version is ~10x slower: 3 repeats of it
    X_train, train, _, _, _ = load_split()
    W = X_train.shape[1]
    load_start = [round(v, 2) for v in os.getloadavg()]
    per_k = {}
    for K in args.topics:
        t0 = time.perf_counter()
        theta = _fitted_theta(X_train, K)
        samplers = {
            n: sampler_speed(n, train, theta, K, W, sweeps, repeats) for n in SAMPLERS
        }
        versus = estimator_vs_numpy(train, theta, K, W, sweeps, repeats, loop_repeats)
        agree = (
            agreement(train, theta, K, W, sweeps, *((4, 3) if args.quick else (20, 8)))
            if K == args.topics[0]
            else None
        )
        per_k[K] = {
            "samplers": samplers,
            "estimator": versus,
            "agreement": agree,
            "load_after": [round(v, 2) for v in os.getloadavg()],
            "section_s": time.perf_counter() - t0,
        }
        for n, r in samplers.items():
            c = r["cpu"]
            print(
                f"  K = {K} {n}: {r['wall']['docs_per_s']:.1f} documents/s (wall), "
                f"{c['docs_per_s']:.1f} (CPU); Gibbs "
                f"{c['share']['gibbs']['median']:.2f}, update "
                f"{c['share']['update']['median']:.3f} of the step's CPU time",
                flush=True,
            )
        for v in ("numpy vectorised", "numpy loop"):
            print(
                f"  K = {K} {v} / JAX estimator: {_range(versus[v]['ratio_to_jax'])}",
                flush=True,
            )
        if agree:
            print(f"  agreement: {agree}", flush=True)
    rows = [
        {
            "K": K,
            "sampler": n,
            "step wall s, median [min-max]": _range(r["wall"]["step_s"]),
            "documents/s (wall)": f"{r['wall']['docs_per_s']:.1f}",
            "documents/s (CPU)": f"{r['cpu']['docs_per_s']:.1f}",
            "Gibbs sweeps (CPU) "
            "[wall]": f"{_range(r['cpu']['share']['gibbs'], '{:.2f}')} "
            f"[{r['wall']['share']['gibbs']['median']:.2f}]",
            "sampler update (CPU) "
            "[wall]": f"{_range(r['cpu']['share']['update'], '{:.3f}')} "
            f"[{r['wall']['share']['update']['median']:.3f}]",
            "rest (CPU)": f"{r['cpu']['share_rest_median']:.2f}",
        }
        for K, d in per_k.items()
        for n, r in d["samplers"].items()
    ]
    est_rows = [
        {
            "K": K,
            "estimator": v,
            "s a call, median [min-max]": _range(e[v]["wall_s"]),
            "CPU s a call": f"{e[v]['cpu_s']['median']:.3g}",
            "repeats": len(e[v]["wall_s"]["all"]),
            "documents/s": f"{e[v]['docs_per_s']:.1f}",
            "time / JAX's, median [min-max]": _range(e[v]["ratio_to_jax"], "{:.2f}")
            if v != "jax"
            else "1",
            "CPU time / JAX's": _range(e[v]["cpu_ratio_to_jax"], "{:.2f}")
            if v != "jax"
            else "1",
        }
        for K, d in per_k.items()
        for v in ("jax", "numpy vectorised", "numpy loop")
        for e in [d["estimator"]]
    ]
    K0 = args.topics[0]
    ag = per_k[K0]["agreement"]
    notes = [
        f"Reuters training split ({train.tokens.shape[0]} documents, padded to "
        f"{train.tokens.shape[1]} tokens), minibatches of {BATCH}, {sweeps[0]} burn-in "
        f"+ {sweeps[1]} kept Gibbs sweeps of eq. (32) a document (full: the "
        f"experiment's 10 + 10; `--quick`: 2 + 2), K in {list(args.topics)}, W = {W}; "
        "theta~ = the `lda` package's topics after 50 collapsed-Gibbs iterations. JAX "
        "in float32, jitted; first calls (compilation) excluded.",
        "Machine load (1/5/15-minute averages, 2 cores shared with other jobs): "
        f"{load_start} at the start, "
        + ", ".join(f"{per_k[K]['load_after']} after K = {K}" for K in per_k)
        + ". Figures are ratios within interleaved repeats for that reason; absolute "
        "times move with the load.",
        "Documents/s = 50 / the median time of one jitted sampler step (minibatch, "
        "Gibbs, eq. (31), the library's update over the K*W coordinates, mirroring), "
        "by wall clock and by process CPU time (the work done, all threads: less moved "
        "by other jobs than wall time). Shares: the Gibbs sweeps alone "
        "(`expected_word_topic_counts` on 50 documents) and the sampler update alone "
        "(the same step with the estimator replaced by theta~ -> -theta~), each over "
        "the whole step's time in the same repeat, by CPU time (median [min-max] over "
        "repeats; the wall-time median in brackets); rest = 1 - both (minibatch "
        "gather, the scatter onto words, eq. (31), dispatch).",
        "JAX vs NumPy: the same estimator (benchmarks/lda_numpy.py; "
        "tests/models/test_lda_numpy.py checks it against the exact expectation on "
        "the tiny corpus, as tests/models/test_lda.py checks the JAX one), at the "
        "same theta~, corpus, K and sweeps, one call of each per repeat, interleaved; "
        "'numpy vectorised' advances the 50 documents together one token position at "
        "a time (the analogue of the JAX vmap), 'numpy loop' is token by token "
        f"({loop_repeats} repeats). Time / JAX's > 1: JAX is faster by that factor.",
    ]
    cpu_min = {
        K: sum(
            SIZES["full"]["steps"] * BATCH / r["cpu"]["docs_per_s"]
            for r in d["samplers"].values()
        )
        / 60
        for K, d in per_k.items()
    }
    notes.append(
        "At these rates the experiment (`--size full`: "
        f"{SIZES['full']['steps'] * BATCH:,} documents per sampler, four samplers) "
        "costs "
        + ", ".join(f"{m:.0f} min of CPU at K = {K}" for K, m in cpu_min.items())
        + " in sampler steps alone (perplexity evaluations and the `lda` package's fit "
        "extra)."
    )
    if ag:
        notes.append(
            f"Agreement in expectation (K = {K0}, one fixed minibatch, theta~ fixed): "
            "per-topic totals and the per-topic counts of the 5 most frequent words "
            f"({ag['summaries']} numbers), {ag['runs_jax']} JAX runs "
            + "; ".join(
                f"vs {ag[v]['runs']} {v} runs: max |Welch t| {ag[v]['max_abs_t']:.2f}, "
                f"Bonferroni p {ag[v]['bonferroni_p']:.2f} over the {ag[v]['tested']} "
                "that vary; of the "
                f"{ag[v]['constant_and_equal'] + ag[v]['constant_mismatch']} constant "
                f"in every run of both, {ag[v]['constant_mismatch']} differ"
                for v in ("numpy vectorised", "numpy loop")
            )
            + ". Verdict: "
            + (
                "no disagreement detected (every Bonferroni p > 0.01, no constant "
                "differs)."
                if all(
                    ag[v]["bonferroni_p"] > 0.01 and ag[v]["constant_mismatch"] == 0
                    for v in ("numpy vectorised", "numpy loop")
                )
                else "DISAGREEMENT (a Bonferroni p <= 0.01 or a constant differs)."
            )
        )
    payload = {
        "size": size,
        "sweeps": sweeps,
        "batch_size": BATCH,
        "repeats": repeats,
        "loop_repeats": loop_repeats,
        "load_start": load_start,
        "per_topics": per_k,
    }
    out_dir = Path(args.out_dir)
    cmd = (
        "python benchmarks/bench_lda.py --speed --topics "
        + " ".join(map(str, args.topics))
        + (" --quick" if args.quick else "")
        + f" --repeats {repeats}"
    )
    _, md = write_results(
        "lda_speed",
        payload,
        rows,
        out_dir=out_dir,
        command=cmd,
        notes=notes,
        title="Online LDA: documents per second, the Gibbs sweeps' share, JAX against "
        "NumPy",
    )
    md.write_text(
        md.read_text()
        + "\n## The estimator: JAX (jitted) against NumPy\n\n"
        + markdown_table(est_rows)
    )


def main():
    parser = base_parser(
        "online LDA on Reuters: perplexity vs documents seen for the four SG samplers"
    )
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument(
        "--speed",
        action="store_true",
        help="documents/s, Gibbs share, JAX vs NumPy (lda_speed.{json,md}), not the "
        "experiment",
    )
    parser.add_argument(
        "--topics",
        type=int,
        nargs="+",
        default=[20],
        help="--speed: the numbers of topics K",
    )
    args = parser.parse_args()
    if args.speed:
        return speed_main(args)
    cfg = SIZES[args.size]
    K = cfg["topics"]
    X_train, train, observed, scored, vocab = load_split()
    W = X_train.shape[1]
    print(
        f"size: {args.size}; {train.tokens.shape[0]} training documents, "
        f"{observed.tokens.shape[0]} held out; K = {K}, W = {W}",
        flush=True,
    )
    results = {
        name: run_sampler(name, train, observed, scored, K, W, args.size)
        for name in SAMPLERS
    }
    anchor = lda_anchor(X_train, observed, scored, K, cfg["lda_iter"])
    print(
        f"  lda package: perplexity {anchor['perplexity']:.1f} ({anchor['wall_s']:.1f} "
        "s)",
        flush=True,
    )

    rows = []
    for name in SAMPLERS:
        r = results[name]
        for d, p in zip(r["docs_seen"], r["perplexity"], strict=True):
            rows.append({"sampler": name, "docs_seen": d, "perplexity": round(p, 1)})
    md_rows = [
        {
            "documents seen": d,
            **{n: f"{results[n]['perplexity'][i]:.1f}" for n in SAMPLERS},
        }
        for i, d in enumerate(results["SGLD"]["docs_seen"])
    ]
    final = {n: results[n]["perplexity"][-1] for n in SAMPLERS}
    holds = final["SGRHMC"] <= final["SGRLD"] and max(
        final["SGRLD"], final["SGRHMC"]
    ) < min(final["SGLD"], final["SGHMC"])
    tables = {n: top_words(results[n]["theta"], vocab) for n in ("SGRHMC",)}
    tables["lda package"] = top_words(anchor["theta"], vocab)
    payload = {
        "size": args.size,
        "config": cfg,
        "batch_size": BATCH,
        "steps": STEP,
        "sgrld_schedule": SGRLD_SCHEDULE,
        "perplexity_sweeps": PERPLEXITY_SWEEPS,
        "num_train": int(train.tokens.shape[0]),
        "num_heldout": int(observed.tokens.shape[0]),
        "uniform_perplexity": uniform_perplexity(W),
        "curves": {
            n: {
                k: results[n][k]
                for k in ("docs_seen", "perplexity", "wall_s", "flagged_steps", "gamma")
            }
            for n in SAMPLERS
        },
        "lda_package": {k: anchor[k] for k in ("perplexity", "wall_s", "n_iter")},
        "paper_ordering_holds": bool(holds),
        "top_words": {
            n: [{"topic": k, "words": w} for k, w in t] for n, t in tables.items()
        },
    }
    walls = ", ".join(
        f"{n} {results[n]['wall_s']:.0f} s "
        f"({results[n]['wall_s'] / (cfg['steps'] * BATCH) * 1e3:.1f} ms/document, "
        f"{results[n]['flagged_steps']} steps flagged diverged)"
        for n in SAMPLERS
    )
    notes = [
        f"size {args.size}: K = {K}, {train.tokens.shape[0]} training / "
        f"{observed.tokens.shape[0]} held-out documents (numpy seed 0), minibatches of "
        f"{BATCH}, {cfg['burnin']} burn-in + {cfg['kept']} kept Gibbs sweeps per "
        "document per gradient; perplexity by document completion at the current "
        f"sample, {PERPLEXITY_SWEEPS[0]} + {PERPLEXITY_SWEEPS[1]} sweeps, each model's "
        "own gamma.",
        "Hyper-parameters (paper 2 F.2): SGRLD/SGRHMC alpha = 1e-4, gamma = 0.01; "
        f"SGLD/SGHMC alpha = 0.01, gamma = 0.1. Steps: SGLD {STEP['SGLD']} (D = I), "
        f"SGHMC {STEP['SGHMC']} (C = I), SGRHMC {STEP['SGRHMC']}, SGRLD (a(1 + "
        f"t/b))^-c with (a, b, c) = {SGRLD_SCHEDULE} (not stated in paper 2; ours).",
        f"Anchor: lda package, collapsed Gibbs, {cfg['lda_iter']} iterations, alpha = "
        f"0.1, eta = 0.01: perplexity {anchor['perplexity']:.1f} "
        f"({anchor['wall_s']:.1f} s). Uniform model: {W}.",
        f"Sampling wall time ({cfg['steps']} steps each; perplexity evaluations "
        f"excluded): {walls}.",
        "Paper's ordering (SGRHMC <= SGRLD < SGLD, SGHMC at the last evaluation): "
        f"{'holds' if holds else 'does not hold'} here (final: "
        + ", ".join(f"{n} {final[n]:.1f}" for n in SAMPLERS)
        + ").",
    ]
    notes.append(
        "Documents per second of each sampler, the Gibbs sweeps' share of a step and "
        "the JAX estimator against NumPy: lda_speed.md (`python "
        "benchmarks/bench_lda.py --speed --topics 20 50`)."
    )
    for n, t in tables.items():
        notes.append(
            f"Top 7 words, {n}: " + "; ".join(f"topic {k}: {' '.join(w)}" for k, w in t)
        )
    out_dir = Path(args.out_dir)
    write_results(
        "lda",
        payload,
        rows,
        columns=["documents seen", *SAMPLERS],
        out_dir=out_dir,
        title="Online LDA on Reuters: held-out perplexity vs documents seen",
        notes=notes,
        command=f"python benchmarks/bench_lda.py --size {args.size}",
        md_rows=md_rows,
    )
    plot(results, anchor, out_dir / "lda.png")


if __name__ == "__main__":
    main()
