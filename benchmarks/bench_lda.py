"""Online LDA on the Reuters corpus with SGLD, SGHMC, SGRLD and SGRHMC (paper 2, appendix F.2).

The `lda` package's Reuters corpus (395 documents, 4,258 words; in its wheel, nothing is
downloaded) is split 80/20 into training and held-out documents (numpy seed 0). Each sampler is
the library's own (``cj.sgld``, ``cj.sghmc``, ``cj.sgrld``, ``cj.sgrhmc``) running the minibatch
estimator of ``cenlmc_jax.sgmcmc.lda`` (eq. (31), minibatches of 50 documents, Gibbs sweeps of
eq. (32)), wrapped in ``mirrored`` (``θ̃ ← |θ̃|`` after each step). Every ``--eval-every`` steps
the held-out perplexity by document completion is taken at the current sample. The anchor is the
`lda` package's collapsed Gibbs sampler on the same training documents, its ``topic_word_`` scored
by the same perplexity function.

    python benchmarks/bench_lda.py --size small     # K = 20, 40 steps per sampler: a smoke run
    python benchmarks/bench_lda.py --size full      # K = 20, 400 steps (20,000 documents seen)

Writes benchmarks/results/lda.{json,md} and lda.png.
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
from cenlmc_jax.sgmcmc import lda as L  # noqa: E402

SAMPLERS = ("SGLD", "SGHMC", "SGRLD", "SGRHMC")
#: paper 2 F.2's step sizes; SGRLD's schedule constants are not stated there (it keeps those of
#: Patterson & Teh, whose text is not at hand): a, b, c below are ours (see the notes).
STEP = {"SGLD": 0.01, "SGHMC": 0.1, "SGRHMC": 0.02}
SGRLD_SCHEDULE = (10.0, 1000.0, 0.6)
SIZES = {  # steps per sampler, evaluations, Gibbs sweeps (burn-in, kept) per gradient, lda-package iterations
    "small": dict(topics=20, steps=40, eval_every=20, burnin=5, kept=5, lda_iter=200),
    "full": dict(topics=20, steps=400, eval_every=25, burnin=10, kept=10, lda_iter=1500),
}
BATCH = 50
PERPLEXITY_SWEEPS = (50, 50)  # burn-in, kept: Gibbs on each held-out document's observed half


def load_split(seed: int = 0, test_fraction: float = 0.2):
    """Reuters count matrix split by documents; returns (X_train, train Corpus, observed, scored, vocab)."""
    import lda

    X = np.asarray(lda.datasets.load_reuters())
    vocab = list(lda.datasets.load_reuters_vocab())
    perm = np.random.default_rng(seed).permutation(X.shape[0])
    n_test = int(round(test_fraction * X.shape[0]))
    test, train = perm[:n_test], perm[n_test:]
    observed, scored = L.split_halves(L.corpus_from_counts(X[test]), seed)
    return X[train], L.corpus_from_counts(X[train]), observed, scored, vocab


def build(name: str, train: L.Corpus, K: int, W: int, burnin: int, kept: int):
    """The mirrored library sampler for ``name`` and the hyper-parameters its posterior uses."""
    hypers = L.RIEMANNIAN_HYPERS if name in ("SGRLD", "SGRHMC") else L.EUCLIDEAN_HYPERS
    est = L.lda_grad_estimator(train, K, W, hypers, BATCH, num_burnin=burnin, num_kept=kept)
    if name == "SGLD":
        def make(e):
            return cj.sgld(e, STEP["SGLD"])
    elif name == "SGHMC":
        def make(e):
            return cj.sghmc(e, STEP["SGHMC"], friction=1.0, blowup_factor=float("inf"))
    elif name == "SGRLD":
        def make(e):
            return cj.sgrld(e, L.paper_schedule(*SGRLD_SCHEDULE), L.inv_metric)
    else:
        def make(e):
            return cj.sgrhmc(e, STEP["SGRHMC"], L.inv_metric)
    alg = L.coordinatewise(make, est)
    return L.mirrored(alg), hypers


def run_sampler(name, train, observed, scored, K, W, size, seed=0):
    """Steps in jitted chunks of ``eval_every``; perplexity after each. Returns a dict of the curve."""
    cfg = SIZES[size]
    alg, hypers = build(name, train, K, W, cfg["burnin"], cfg["kept"])
    key_init, key_mom, key_run, key_perp = jax.random.split(jax.random.key(seed), 4)
    state = alg.init(L.init_theta(key_init, K, W), key_mom if name in ("SGHMC", "SGRHMC") else None)

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
        p = float(perplexity(key_perp, theta, observed, scored, hypers.gamma, *PERPLEXITY_SWEEPS))
        docs.append((i + 1) * cfg["eval_every"] * BATCH)
        perps.append(p)
        print(f"  {name}: {docs[-1]:6d} documents seen, perplexity {p:8.1f}", flush=True)
    return dict(docs_seen=docs, perplexity=perps, wall_s=sampling_s, flagged_steps=flagged,
                theta=np.asarray(L.topic_word(state.position.reshape(K, W))), gamma=hypers.gamma)


def lda_anchor(X_train, observed, scored, K, n_iter, seed=0):
    """The `lda` package's collapsed Gibbs (alpha = 0.1, eta = 0.01, its defaults), scored by the same function."""
    import logging

    import lda

    logging.getLogger("lda").setLevel(logging.WARNING)
    t0 = time.perf_counter()
    model = lda.LDA(n_topics=K, n_iter=n_iter, alpha=0.1, eta=0.01, random_state=seed)
    model.fit(X_train)
    wall = time.perf_counter() - t0
    theta = jnp.asarray(model.topic_word_, jnp.float32)
    perp = float(jax.jit(L.completion_perplexity, static_argnums=(5, 6))(
        jax.random.key(seed), theta, observed, scored, 0.1, *PERPLEXITY_SWEEPS))
    return dict(perplexity=perp, wall_s=wall, n_iter=n_iter, theta=np.asarray(model.topic_word_))


def top_words(theta, vocab, n_topics=8, n_words=7, seed=0):
    """The ``n_words`` heaviest words of ``n_topics`` topics drawn at random (numpy seed), as rows."""
    pick = np.sort(np.random.default_rng(seed).choice(theta.shape[0], n_topics, replace=False))
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
    ax.axhline(anchor["perplexity"], color="k", ls="--", lw=1, label="lda package (collapsed Gibbs)")
    ax.set_xlabel("documents seen")
    ax.set_ylabel("held-out perplexity")
    ax.set_yscale("log")
    ax.set_title(f"Online LDA on Reuters (K = {results['SGRHMC']['theta'].shape[0]})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main():
    parser = base_parser("online LDA on Reuters: perplexity vs documents seen for the four SG samplers")
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    args = parser.parse_args()
    cfg = SIZES[args.size]
    K = cfg["topics"]
    X_train, train, observed, scored, vocab = load_split()
    W = X_train.shape[1]
    print(f"size: {args.size}; {train.tokens.shape[0]} training documents, {observed.tokens.shape[0]} held out; "
          f"K = {K}, W = {W}", flush=True)
    results = {name: run_sampler(name, train, observed, scored, K, W, args.size) for name in SAMPLERS}
    anchor = lda_anchor(X_train, observed, scored, K, cfg["lda_iter"])
    print(f"  lda package: perplexity {anchor['perplexity']:.1f} ({anchor['wall_s']:.1f} s)", flush=True)

    rows = []
    for name in SAMPLERS:
        r = results[name]
        for d, p in zip(r["docs_seen"], r["perplexity"], strict=True):
            rows.append({"sampler": name, "docs_seen": d, "perplexity": round(p, 1)})
    md_rows = [{"documents seen": d, **{n: f"{results[n]['perplexity'][i]:.1f}" for n in SAMPLERS}}
               for i, d in enumerate(results["SGLD"]["docs_seen"])]
    final = {n: results[n]["perplexity"][-1] for n in SAMPLERS}
    holds = final["SGRHMC"] <= final["SGRLD"] and max(final["SGRLD"], final["SGRHMC"]) < min(final["SGLD"],
                                                                                            final["SGHMC"])
    tables = {n: top_words(results[n]["theta"], vocab) for n in ("SGRHMC",)}
    tables["lda package"] = top_words(anchor["theta"], vocab)
    payload = {
        "size": args.size, "config": cfg, "batch_size": BATCH, "steps": STEP, "sgrld_schedule": SGRLD_SCHEDULE,
        "perplexity_sweeps": PERPLEXITY_SWEEPS, "num_train": int(train.tokens.shape[0]),
        "num_heldout": int(observed.tokens.shape[0]), "uniform_perplexity": uniform_perplexity(W),
        "curves": {n: {k: results[n][k] for k in ("docs_seen", "perplexity", "wall_s", "flagged_steps", "gamma")}
                   for n in SAMPLERS},
        "lda_package": {k: anchor[k] for k in ("perplexity", "wall_s", "n_iter")},
        "paper_ordering_holds": bool(holds),
        "top_words": {n: [{"topic": k, "words": w} for k, w in t] for n, t in tables.items()},
    }
    walls = ", ".join(f"{n} {results[n]['wall_s']:.0f} s ({results[n]['wall_s'] / (cfg['steps'] * BATCH) * 1e3:.1f}"
                      f" ms/document, {results[n]['flagged_steps']} steps flagged diverged)" for n in SAMPLERS)
    notes = [
        f"size {args.size}: K = {K}, {train.tokens.shape[0]} training / {observed.tokens.shape[0]} held-out documents "
        f"(numpy seed 0), minibatches of {BATCH}, {cfg['burnin']} burn-in + {cfg['kept']} kept Gibbs sweeps per "
        f"document per gradient; perplexity by document completion at the current sample, "
        f"{PERPLEXITY_SWEEPS[0]} + {PERPLEXITY_SWEEPS[1]} sweeps, each model's own gamma.",
        "Hyper-parameters (paper 2 F.2): SGRLD/SGRHMC alpha = 1e-4, gamma = 0.01; SGLD/SGHMC alpha = 0.01, "
        f"gamma = 0.1. Steps: SGLD {STEP['SGLD']} (D = I), SGHMC {STEP['SGHMC']} (C = I), SGRHMC {STEP['SGRHMC']}, "
        f"SGRLD (a(1 + t/b))^-c with (a, b, c) = {SGRLD_SCHEDULE} (not stated in paper 2; ours).",
        f"Anchor: lda package, collapsed Gibbs, {cfg['lda_iter']} iterations, alpha = 0.1, eta = 0.01: perplexity "
        f"{anchor['perplexity']:.1f} ({anchor['wall_s']:.1f} s). Uniform model: {W}.",
        f"Sampling wall time ({cfg['steps']} steps each; perplexity evaluations excluded): {walls}.",
        "Paper's ordering (SGRHMC <= SGRLD < SGLD, SGHMC at the last evaluation): "
        f"{'holds' if holds else 'does not hold'} here (final: "
        + ", ".join(f"{n} {final[n]:.1f}" for n in SAMPLERS) + ").",
    ]
    for n, t in tables.items():
        notes.append(f"Top 7 words, {n}: " + "; ".join(f"topic {k}: {' '.join(w)}" for k, w in t))
    out_dir = Path(args.out_dir)
    write_results("lda", payload, rows, columns=["documents seen", *SAMPLERS], out_dir=out_dir,
                  title="Online LDA on Reuters: held-out perplexity vs documents seen", notes=notes,
                  command=f"python benchmarks/bench_lda.py --size {args.size}", md_rows=md_rows)
    plot(results, anchor, out_dir / "lda.png")


if __name__ == "__main__":
    main()
