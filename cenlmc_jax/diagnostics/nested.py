r"""Nested R-hat and the many-chain verdict (Margossian, Hoffman, Sountsov,
Riou-Durand, Vehtari, Gelman 2024).

Split R-hat asks whether *each* chain has crossed the whole posterior. With
thousands of short chains (a GPU batch job, the chains ``cj.langevin_warmup`` hands
over) that is the wrong question: the pooled estimates reach their standard error
long before any one chain has explored much, and a run judged by split R-hat is
called unconverged while its answer is right (issue 46: 1.33 on a banana whose sds
were right). The many-chain question is whether the chains have *forgotten where
they started*. Nested R-hat answers it with **superchains**: ``K`` groups of ``M``
chains, each group started from one shared point.

**Nested R-hat** (paper, eq. 15-18; the ``posterior`` package's ``rhat_nested``).
For one quantity ``f`` with draws ``f_{nmk}`` (draw ``n`` of chain ``m`` of
superchain ``k``; ``N`` draws, ``M`` chains, ``K`` superchains), chain means
``f̄_{.mk}``, superchain means ``f̄_{..k}`` and the overall mean ``f̄_{...}``::

    B̂_ν = 1/(K−1) Σ_k (f̄_{..k} − f̄_{...})²                 between superchains
    B̃_k = 1/(M−1) Σ_m (f̄_{.mk} − f̄_{..k})²    (0 if M = 1)  between its chains
    W̃_k = 1/M Σ_m 1/(N−1) Σ_n (f_{nmk} − f̄_{.mk})²  (0 if N = 1)  within its chains
    Ŵ_ν = 1/K Σ_k (B̃_k + W̃_k)
    nR̂ = sqrt(1 + B̂_ν / Ŵ_ν).

While the chains remember their shared starts, the superchain means differ by the
starts' spread and ``nR̂`` is large. Once they have forgotten them, ``B̂_ν`` is the
variance of a mean of ``M N / τ`` effective draws, ``nR̂² − 1 ≈ τ / (M N)``, small
even for a short ``N`` because the ``M`` chains of a superchain average out. The
threshold is the paper's ``1 + δ``, :data:`NESTED_RHAT_MAX` ``= 1.01``. With ``M = 1``
(no shared starts) it is the classic R-hat without the ``(N−1)/N`` factor, so it
cannot pass many short independent chains: the superchains are what make it work.

**Where the superchains come from.** ``cj.langevin_warmup``'s exact default hands
over ``K`` points of its final ensemble, each repeated ``M`` times
(:func:`superchain_starts`, :func:`default_superchain_size`), superchain ``k`` being
rows ``k M .. (k+1) M − 1``. :func:`superchain_size` finds that layout again from
any starting positions (contiguous blocks of identical rows), so ``cj.sample``, the
CLI and :func:`many_chain_diagnostics` need no extra argument: chains that share a
start are a superchain by definition.

**The rest of the verdict** (:func:`many_chain_problems`), all on ``y = (x, x²)``
per coordinate:

* **MCSE and ESS from the superchains.** The ``K`` superchain means are independent
  (their starts are different warm-up particles, their noise independent), so the
  Monte-Carlo standard error of the pooled mean is ``sd_k(f̄_{..k}) / sqrt(K)``, with
  ``K − 1`` degrees of freedom and no autocorrelation model; ``ESS = Var(f) / MCSE²``
  (at stationarity ``K M N / τ``). The floor is :data:`ESS_MIN` (Vehtari et al. 2021's
  400: the standard errors are themselves reliable above it).
* **Stationarity of the ensemble's moments** (the ensemble's own check): the pooled
  mean over the first and the second half of the window, compared superchain by
  superchain: ``D_k = f̄^{(2)}_{..k} − f̄^{(1)}_{..k}``, ``z = mean_k D_k /
  (sd_k D_k / sqrt(K))``. At stationarity ``E D_k = 0`` exactly whatever the
  autocorrelation; a run still relaxing from a biased start drifts, and ``|z|`` above
  the Bonferroni bound of ``2 d`` tests at a family-wise rate :data:`DRIFT_FALSE_ALARM`
  says so.
* **The chains' memory against the window** (:func:`half_correlation`): the
  correlation across chains of a chain's mean over the window's first half with its
  mean over the second, the lag-one correlation of batch means that the batch-means
  method checks (Law & Carson 1979), here over many chains. Nested R-hat sees only
  the directions its starts were spread along; the superchain starts are pushed out
  radially, and on a curved ridge (the banana) the push relaxes along the fast
  directions within a few moves while the slow one, along the ridge, still carries
  the warm-up's narrowness: the CLI stopped after 50 moves with x₁'s sd 11-21 % low
  and every other check passed. A correlation above :data:`MEMORY_MAX` (by more
  than its noise, Bonferroni over the ``2 d`` quantities) says each chain still
  carries its start through the window: run longer.
* **Stuck chains are judged by their effect** (:func:`stuck_effect`): a chain that
  never moved is a problem only when leaving it out moves a pooled estimate by more
  than its MCSE; otherwise it is a note.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cenlmc_jax._batch import batch_logdensity
from cenlmc_jax.types import Array

__all__ = [
    "NESTED_RHAT_MAX",
    "ESS_MIN",
    "DRIFT_FALSE_ALARM",
    "MEMORY_MAX",
    "MIN_SUPERCHAINS",
    "nested_rhat",
    "superchain_size",
    "default_superchain_size",
    "superchain_starts",
    "ChainStats",
    "chain_stats",
    "stream_chain_stats",
    "merge_chain_stats",
    "half_correlation",
    "ManyChainDiagnostics",
    "many_chain_diagnostics",
    "many_chain_problems",
    "stuck_effect",
]

#: The paper's threshold ``1 + δ``, ``δ = 0.01``.
NESTED_RHAT_MAX = 1.01
#: The ESS asked of every pooled mean (of ``x`` and ``x²``): Vehtari et al.'s 400.
ESS_MIN = 400.0
#: Family-wise false-alarm rate of the drift test over the ``2 d`` quantities (and of
#: the memory test's).
DRIFT_FALSE_ALARM = 0.01
#: The largest correlation across chains of a chain's mean over the window's first
#: half with its mean over the second (:func:`half_correlation`) that the verdict
#: accepts. With a memory that decays geometrically, ``r ≈ s / (2h)`` for halves of
#: ``h`` draws and a decay scale ``s``, and the start's influence on the window (after
#: a burn-in of ``2h``) is about ``e^{−1/r}`` of the hand-over's bias: 4 % at 0.3.
MEMORY_MAX = 0.3
#: Fewer superchains than this: the between-superchain variance has too few degrees
#: of freedom (its relative sd is ``sqrt(2 / (K − 1))``: 0.53 at K = 8), and the
#: verdict falls back to split R-hat.
MIN_SUPERCHAINS = 8
#: The superchains the hand-over aims for at least: ``sqrt(2/31) = 0.25`` relative sd.
TARGET_SUPERCHAINS = 32
#: Chains per superchain the hand-over tries, largest first.
SUPERCHAIN_SIZES = (16, 8, 4, 2)


def nested_rhat(samples: Any, superchain_size: int) -> Array:
    """Nested R-hat of draws chains first (superchain k: chains k M to k M + M − 1).

    Args:
      samples: ``(chains, draws, *event)`` draws (chains first).
      superchain_size: ``M``, chains per superchain; must divide the chains, with at
        least two superchains.

    Returns:
      ``nR̂`` per coordinate, shape ``event`` (module docstring, eq. 15-18); NaN for a
      coordinate constant in every draw.

    Raises:
      ValueError: ``samples`` has fewer than 2 axes, or ``superchain_size`` is not an
        int >= 1 dividing the chains into at least two superchains.
    """
    x = jnp.asarray(samples)
    if x.ndim < 2:
        raise ValueError(
            "samples must be chains first, (chains, draws, *event); got shape "
            f"{tuple(x.shape)}."
        )
    chains = x.shape[0]
    m = _check_size(superchain_size, chains)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.result_type(float))
    flat = x.reshape(chains, x.shape[1], -1)
    mean = jnp.mean(flat, axis=1)
    var = jnp.var(flat, axis=1, ddof=1) if x.shape[1] > 1 else jnp.zeros_like(mean)
    out = _nested_core(mean, var, m)
    constant = jnp.all(flat == flat[:1, :1], axis=(0, 1))
    return jnp.where(constant, jnp.nan, out).reshape(x.shape[2:])


def _check_size(superchain_size: Any, chains: int) -> int:
    m = superchain_size
    if (
        isinstance(m, bool)
        or not isinstance(m, (int, np.integer))
        or m < 1
        or chains % m
        or chains // m < 2
    ):
        raise ValueError(
            f"superchain_size must be an int >= 1 that divides the {chains} chains "
            f"into at least 2 superchains; got {superchain_size!r}."
        )
    return int(m)


def _nested_core(mean: Array, var: Array, m: int, xp: Any = jnp) -> Array:
    """nR̂ from chain means and within-chain variances ``(chains, q)`` (``xp``: jnp,
    or np for the verdict's float64 on the host)."""
    k = mean.shape[0] // m
    mean = mean.reshape(k, m, -1)
    sc_mean = xp.mean(mean, axis=1)
    between_super = xp.var(sc_mean, axis=0, ddof=1)
    between_chain = xp.var(mean, axis=1, ddof=1) if m > 1 else xp.zeros_like(sc_mean)
    within_chain = xp.mean(var.reshape(k, m, -1), axis=1)
    within = xp.mean(between_chain + within_chain, axis=0)
    return xp.sqrt(1.0 + between_super / within)


def superchain_size(positions: Any) -> int:
    """``M`` of starting positions laid out in superchains, else 1.

    Superchains are contiguous blocks of ``M >= 2`` identical rows (every leaf, bit for
    bit), at least two blocks, the largest such ``M``; anything else is 1 (independent
    starts).

    Args:
      positions: ``(chains, ...)`` array or pytree of them.

    Returns:
      An int ``M >= 1``.
    """
    leaves = [np.asarray(a) for a in jax.tree_util.tree_leaves(positions)]
    if not leaves or any(a.ndim < 1 for a in leaves):
        return 1
    n = leaves[0].shape[0]
    if any(a.shape[0] != n for a in leaves) or n < 4:
        return 1
    rows = np.concatenate([a.reshape(n, -1) for a in leaves], axis=1)
    # the run lengths of identical consecutive rows
    same = np.all(rows[1:] == rows[:-1], axis=1)
    if not same.any():
        return 1
    breaks = np.flatnonzero(~same) + 1
    lengths = np.diff(np.concatenate([[0], breaks, [n]]))
    m = int(lengths[0])
    if m < 2 or np.any(lengths != m) or n // m < 2:
        return 1
    return m


def default_superchain_size(num_chains: int) -> int:
    """``M`` for ``num_chains`` chains: the largest of :data:`SUPERCHAIN_SIZES` that
    divides them and leaves at least :data:`TARGET_SUPERCHAINS` superchains (1,024
    chains: 64 x 16; 2,000: 125 x 16; 256: 32 x 8), else the largest that leaves
    :data:`MIN_SUPERCHAINS`; 1 (no superchains) below that.

    Args:
      num_chains: the chains handed over.

    Returns:
      ``M``, an int.
    """
    n = int(num_chains)
    for floor in (TARGET_SUPERCHAINS, MIN_SUPERCHAINS):
        for m in SUPERCHAIN_SIZES:
            if n % m == 0 and n // m >= floor:
                return m
    return 1


#: How far the superchain starts are pushed out from the ensemble's mean
#: (:func:`superchain_starts`).
OVERDISPERSION = 1.2


def superchain_starts(
    rng_key: Any,
    positions: Array,
    superchain_size: int,
    overdispersion: float = OVERDISPERSION,
    logdensity_fn: Any = None,
) -> Array:
    """``K = N / M`` of the ``N`` positions, drawn without replacement, pushed out from
    the ensemble's mean ``m`` to ``m + c (x − m)`` (``c = overdispersion``), each
    repeated ``M`` times: superchain ``k`` is rows ``k M .. k M + M − 1``.

    Why overdispersed: nested R-hat sees that the chains remember their starts only
    when the starts are spread wider than ``π`` (the paper's assumption, as for
    Gelman and Rubin's R-hat). Started at the warm-up's own particles, a warm-up
    ensemble too narrow in a slow direction (a banana's arms under MALA) passes the
    check while its sd is still 12 % short: each chain forgets its own start long
    before the ensemble forgets the warm-up's.

    Args:
      rng_key: a JAX key.
      positions: ``(N, d)`` (e.g. a warm-up's final ensemble, about ``π``).
      superchain_size: ``M`` dividing ``N``.
      overdispersion: ``c >= 1``.
      logdensity_fn: where given, a start pushed out to a point whose log density is
        not finite keeps its particle's own position.

    Returns:
      ``(N, d)`` starts of the same dtype.
    """
    n = positions.shape[0]
    m = _check_size(superchain_size, n)
    # jax.random.choice(rng_key, n, (n // m,), replace=False), bit for bit, and the
    # arithmetic on the host: as eager JAX operations each compiled a program of its
    # own (about fifteen of them)
    pick = np.asarray(jax.random.permutation(rng_key, n))[: n // m]
    x = np.asarray(positions)
    chosen = x[pick]
    centre = np.asarray(jnp.mean(positions, axis=0))
    pushed = (centre + overdispersion * (chosen - centre)).astype(x.dtype)
    starts = np.repeat(pushed, m, axis=0)
    if logdensity_fn is not None:
        # at the (N, d) starts: the program that checked the warm-up's own starts
        ok = np.isfinite(
            np.asarray(batch_logdensity(jnp.asarray(starts), logdensity_fn))
        )
        starts = np.where(ok[:, None], starts, np.repeat(chosen, m, axis=0))
    return jnp.asarray(starts)


class ChainStats(NamedTuple):
    """Per-chain moments of ``y`` over a window, mergeable across segments.

    Attributes:
      count: draws per chain in the window.
      mean: ``(chains, q)`` chain means.
      m2: ``(chains, q)`` sums of squared deviations from them.
      halves: ``(2, K, q)`` superchain means of the window's first and second half
        (``K`` = chains when there are no superchains).
      half_counts: ``(2,)`` draws per chain in each half.
      chain_halves: ``(2, chains, q)`` chain means of the two halves
        (:func:`half_correlation`), or None.
    """

    count: int
    mean: np.ndarray
    m2: np.ndarray
    halves: np.ndarray
    half_counts: np.ndarray
    chain_halves: Any = None


def _superchain_means(mean: np.ndarray, m: int) -> np.ndarray:
    return mean.reshape(mean.shape[0] // m, m, -1).mean(axis=1)


def chain_stats(draws: Any, superchain_size: int = 1) -> ChainStats:
    """:class:`ChainStats` of ``y = (x, x²)`` from draws chains first ``(C, n, d)``.

    Args:
      draws: ``(chains, draws, ...)``.
      superchain_size: ``M`` (1: every chain its own).

    Returns:
      A :class:`ChainStats`.
    """
    x = np.asarray(draws, np.float64)
    x = x.reshape(x.shape[0], x.shape[1], -1)
    y = np.concatenate([x, x * x], axis=-1)
    n = y.shape[1]
    h = n // 2
    per_chain = np.stack([y[:, :h].mean(axis=1), y[:, n - h :].mean(axis=1)])
    halves = np.stack([_superchain_means(c, superchain_size) for c in per_chain])
    mean = y.mean(axis=1)
    m2 = ((y - mean[:, None]) ** 2).sum(axis=1)
    return ChainStats(n, mean, m2, halves, np.array([h, h]), per_chain)


def stream_chain_stats(diag: Any, superchain_size: int = 1) -> ChainStats | None:
    """:class:`ChainStats` of a streamed run from its online accumulators
    (``RunResult.online``, a :class:`~cenlmc_jax.diagnostics.online.StreamDiagnostics`
    with ``half_mean`` and ``half_m2``: the two half-chains, merged per chain; an odd
    middle draw is not in them). None when it has none.

    Args:
      diag: ``RunResult.online``.
      superchain_size: ``M``.

    Returns:
      A :class:`ChainStats`, or None.
    """
    if isinstance(diag, ManyChainDiagnostics):
        return diag.stats
    if diag is None or getattr(diag, "half_mean", None) is None:
        return None
    hm = np.asarray(diag.half_mean, np.float64)
    h2 = np.asarray(diag.half_m2, np.float64)
    h = int(diag.num_draws) // 2
    mean = hm.mean(axis=0)
    m2 = h2.sum(axis=0) + h * ((hm - mean) ** 2).sum(axis=0)
    halves = np.stack([_superchain_means(hm[i], superchain_size) for i in (0, 1)])
    return ChainStats(2 * h, mean, m2, halves, np.array([h, h]), hm)


def merge_chain_stats(parts: list) -> ChainStats:
    """One :class:`ChainStats` of consecutive windows (Chan et al.'s merge per chain;
    the halves re-formed from the parts' own halves: the first half of the merged
    window is the parts (and half-parts) that lie in it, weighted by their draws).

    Args:
      parts: :class:`ChainStats` of consecutive windows, in order.

    Returns:
      The merged :class:`ChainStats`.
    """
    count = sum(p.count for p in parts)
    mean = sum(p.mean * p.count for p in parts) / count
    m2 = sum(p.m2 + p.count * (p.mean - mean) ** 2 for p in parts)
    per_chain = all(p.chain_halves is not None for p in parts)
    # the half-windows of every part, in order, as (draws, superchain means, chain
    # means)
    pieces = [
        (int(p.half_counts[i]), p.halves[i], p.chain_halves[i] if per_chain else 0.0)
        for p in parts
        for i in (0, 1)
    ]
    total = sum(c for c, _, _ in pieces)
    first, second, seen = [], [], 0
    for piece in pieces:
        c = piece[0]
        (first if seen + c / 2 <= total / 2 else second).append(piece)
        seen += c
    if not first or not second:
        first, second = pieces[:1], pieces[1:]

    def avg(ps):
        w = sum(c for c, _, _ in ps)
        return (
            sum(c * v for c, v, _ in ps) / max(w, 1),
            sum(c * u for c, _, u in ps) / max(w, 1),
            w,
        )

    (a, ca, wa), (b, cb, wb) = avg(first), avg(second)
    chains = np.stack([ca, cb]) if per_chain else None
    return ChainStats(count, mean, m2, np.stack([a, b]), np.array([wa, wb]), chains)


def half_correlation(stats: ChainStats) -> np.ndarray | None:
    """Per quantity, the correlation across chains of a chain's mean over the window's
    first half with its mean over the second: the lag-one correlation of batch means
    (two batches a chain), the classic check that batches are long enough to be
    independent (Law & Carson 1979), pooled over many chains.

    Near 0 when each chain's memory is short beside the half-window (``≈ s / (2h)``
    for a geometric decay of scale ``s`` and halves of ``h`` draws); near 1 while the
    chains still carry their starts through the window (a slow direction the warm-up
    left short: the banana's ridge, where radial superchain starts relax along the
    fast directions within a few moves and nested R-hat passes while the ensemble's
    x₁ sd is still 10-20 % low).

    Args:
      stats: the window's :class:`ChainStats` (its ``chain_halves``).

    Returns:
      ``(q,)`` correlations (0 where a quantity is constant), or None without
      ``chain_halves``.
    """
    if stats.chain_halves is None:
        return None
    a, b = (np.asarray(stats.chain_halves[i], np.float64) for i in (0, 1))
    a, b = a - a.mean(axis=0), b - b.mean(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = (a * b).sum(axis=0) / np.sqrt((a * a).sum(axis=0) * (b * b).sum(axis=0))
    return np.where(np.isfinite(r), r, 0.0)


class ManyChainDiagnostics(NamedTuple):
    """The many-chain verdict's numbers, per quantity ``y = (x, x²)``: ``(2 d,)`` each.

    Attributes:
      nested_rhat: nR̂ (module docstring).
      start_rhat: nR̂ with its stationary floor taken out, ``sqrt(1 + (B̂_ν −
        mean_k B̃_k / M) / Ŵ_ν)`` (at most 1 + 0 when the chains of a superchain agree
        no more than chains of different ones): the start's share alone.
      memory_z: the z of the start's share (``log F``, ``F = M B̂_ν / mean_k B̃_k``, the
        one-way ANOVA ratio of chain means between and within superchains; ``N(0,
        2/(K−1) + 2/(K(M−1)))`` when the start is forgotten).
      ess: ``Var(y) / MCSE²``, MCSE from the superchain means.
      mcse: standard error of the pooled mean of ``y``.
      drift_z: the halves' stationarity z.
      mean: pooled mean of ``y``.
      var: pooled variance of ``y``.
      superchain_size: ``M``.
      num_superchains: ``K``.
      num_draws: draws per chain in the window.
      stats: the window's :class:`ChainStats` (``cj.sample_until`` keeps them, for
        the stuck-chain check), or None.
      going_on: ``cj.sample_until``'s reasons not to stop at this check (the
        verdict's problems, a declared rate still rising, the checks not started
        yet), as sentences; empty at the check where it stopped.
      half_corr: :func:`half_correlation` of the window, or None.
    """

    nested_rhat: np.ndarray
    start_rhat: np.ndarray
    memory_z: np.ndarray
    ess: np.ndarray
    mcse: np.ndarray
    drift_z: np.ndarray
    mean: np.ndarray
    var: np.ndarray
    superchain_size: int
    num_superchains: int
    num_draws: int
    stats: Any = None
    going_on: tuple = ()
    half_corr: Any = None

    @property
    def dim(self) -> int:
        return self.mean.shape[0] // 2


def many_chain_diagnostics(
    stats: ChainStats, superchain_size: int
) -> ManyChainDiagnostics:
    """:class:`ManyChainDiagnostics` from a window's :class:`ChainStats`.

    Args:
      stats: the window's statistics.
      superchain_size: ``M``.

    Returns:
      A :class:`ManyChainDiagnostics`.
    """
    m, n = int(superchain_size), int(stats.count)
    chains = stats.mean.shape[0]
    k = chains // m
    var_chain = stats.m2 / (n - 1) if n > 1 else np.zeros_like(stats.m2)
    with np.errstate(divide="ignore", invalid="ignore"):
        nr = np.asarray(_nested_core(stats.mean, var_chain, m, np), np.float64)
        sc = _superchain_means(stats.mean, m)
        b_nu = sc.var(axis=0, ddof=1)
        b_tilde = stats.mean.reshape(k, m, -1).var(axis=1, ddof=1).mean(axis=0)
        w_nu = b_nu / (nr**2 - 1.0)
        start = np.sqrt(1.0 + np.maximum(b_nu - b_tilde / m, 0.0) / w_nu)
        memory = np.log(m * b_nu / b_tilde) / math.sqrt(
            2.0 / (k - 1) + 2.0 / (k * (m - 1))
        )
        mean = sc.mean(axis=0)
        var = (stats.m2.sum(axis=0) + n * ((stats.mean - mean) ** 2).sum(axis=0)) / (
            chains * n - 1
        )
        mcse = sc.std(axis=0, ddof=1) / math.sqrt(k)
        ess = var / mcse**2
        diff = stats.halves[1] - stats.halves[0]
        drift = diff.mean(axis=0) / (diff.std(axis=0, ddof=1) / math.sqrt(k))
    constant = var == 0
    nr[constant], ess[constant], drift[constant] = np.nan, np.nan, 0.0
    start[constant], memory[constant] = np.nan, 0.0
    return ManyChainDiagnostics(
        nr,
        start,
        memory,
        ess,
        mcse,
        drift,
        mean,
        var,
        m,
        k,
        n,
        half_corr=half_correlation(stats),
    )


def _label(j: int, d: int, labels: list | None) -> str:
    k = j % d
    name = str(labels[k]) if labels is not None and k < len(labels) else f"x[{k}]"
    return name if j < d else f"{name}²"


def drift_bound(dim: int) -> float:
    """Two-sided Bonferroni z of the drift test over ``2 dim`` quantities."""
    p = DRIFT_FALSE_ALARM / (4.0 * max(int(dim), 1))
    return -statistics.NormalDist().inv_cdf(p)


def many_chain_problems(
    diag: ManyChainDiagnostics,
    *,
    rhat_max: float = NESTED_RHAT_MAX,
    ess_min: float = ESS_MIN,
    labels: list | None = None,
) -> list:
    """Sentences for nR̂ above ``rhat_max``, a drifting ensemble, and an ESS below
    ``ess_min`` (module docstring); empty when the many-chain verdict holds.

    Args:
      diag: the :class:`ManyChainDiagnostics`.
      rhat_max: the threshold of the start's share of nested R-hat.
      ess_min: the ESS asked of every mean.
      labels: coordinate names (default ``x[k]``).

    Returns:
      A list of sentences.
    """
    d, out = diag.dim, []
    shape = (
        f"{diag.num_superchains} superchains x {diag.superchain_size} chains x "
        f"{diag.num_draws} draws"
    )
    bound = drift_bound(d)
    bad = np.flatnonzero((diag.start_rhat > rhat_max) & (diag.memory_z > bound))
    if bad.size:
        j = int(bad[np.argmax(diag.start_rhat[bad])])
        out.append(
            f"the chains still remember where they started: the nested R-hat of "
            f"{_label(j, d, labels)} is {diag.nested_rhat[j]:.4g}, of which the shared "
            f"starts' share alone {diag.start_rhat[j]:.4g} > {rhat_max:g} (z = "
            f"{diag.memory_z[j]:.1f} > {bound:.2f}; {bad.size} of "
            f"{diag.nested_rhat.size} quantities; {shape}): the estimates depend on "
            "the start; run longer"
        )
    drifting = np.flatnonzero(np.abs(diag.drift_z) > bound)
    if drifting.size:
        j = int(drifting[np.argmax(np.abs(diag.drift_z[drifting]))])
        out.append(
            f"the ensemble's mean of {_label(j, d, labels)} drifts between the first "
            f"and second half of the run by {abs(diag.drift_z[j]):.1f} standard errors "
            f"(> {bound:.2f}, Bonferroni over {2 * d} quantities; {shape}): the "
            "ensemble is not stationary yet; run longer"
        )
    if diag.half_corr is not None:
        chains = diag.num_superchains * diag.superchain_size
        # above MEMORY_MAX by more than the noise of N chains' correlation (Fisher's
        # z, sd 1/sqrt(N − 3)), Bonferroni over the 2d quantities as the drift test
        excess = (
            np.arctanh(np.clip(diag.half_corr, -0.999999, 0.999999))
            - math.atanh(MEMORY_MAX)
        ) * math.sqrt(max(chains - 3, 1))
        held = np.flatnonzero(excess > bound)
        if held.size:
            j = int(held[np.argmax(diag.half_corr[held])])
            out.append(
                f"the chains' memory spans the window: a chain's mean of "
                f"{_label(j, d, labels)} over the first half of the window and over "
                f"the second are correlated across the chains by "
                f"{diag.half_corr[j]:.2f} > {MEMORY_MAX:g} (z = {excess[j]:.1f} > "
                f"{bound:.2f}; {held.size} of {diag.half_corr.size} quantities; "
                f"{shape}): each chain moves too slowly along some direction for the "
                "burn-in to have removed where it started (nested R-hat cannot see "
                "a direction its starts were not spread along); run longer"
            )
    low = np.flatnonzero(diag.ess < ess_min)
    if low.size:
        j = int(low[np.argmin(diag.ess[low])])
        out.append(
            f"the ESS of the mean of {_label(j, d, labels)} is {diag.ess[j]:.4g} < "
            f"{ess_min:g} (from the spread of the {diag.num_superchains} superchain "
            "means): too few effective draws for the standard errors to be trusted; "
            "run longer"
        )
    return out


def stuck_effect(
    stats: ChainStats, stuck: np.ndarray, diag: ManyChainDiagnostics
) -> float:
    """How far leaving the ``stuck`` chains out moves a pooled mean of ``y``, in units
    of its MCSE: ``max_q |ȳ − ȳ_moving| / MCSE_q`` (0 when none is stuck).

    Args:
      stats: the window's :class:`ChainStats`.
      stuck: ``(chains,)`` booleans.
      diag: the window's :class:`ManyChainDiagnostics` (its MCSE).

    Returns:
      A float (inf when every chain is stuck).
    """
    stuck = np.asarray(stuck, bool)
    if not stuck.any() or stuck.all():
        return 0.0 if not stuck.any() else math.inf
    moving = stats.mean[~stuck].mean(axis=0)
    allm = stats.mean.mean(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.abs(allm - moving) / diag.mcse
    z = z[np.isfinite(z)]
    return float(z.max()) if z.size else 0.0
