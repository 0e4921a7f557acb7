"""GPU check of the ensemble force: correctness against float64 and pairs per second.

Run on a CUDA machine through ``bash benchmarks/gpu_check.sh [OUT_DIR]`` (it
sets up the environment), or directly:
``python benchmarks/gpu_check.py --out-dir DIR [--quick] [--budget-s 420]``.

Sections (each guarded: an exception is recorded in the JSON and the script
goes on; once ``--budget-s`` seconds have passed the remaining ones are skipped):

0. ``probe``: does the Pallas kernel build here, compiled, and match the tiled
   XLA kernel (forces to 1e-4 of their scale, equal ball counts) on a small
   ensemble? ``method="auto"`` never picks the kernel; this is the check to
   pass before anyone makes it do so. Reported as its own row and as
   ``pallas_probe`` in the JSON.
1. ``correctness``: ``pairwise.ensemble_force(method="tiled")`` and
   ``(method="pallas")`` (the dispatch's kernel: distances as tiled, HIGHEST
   products), the Pallas kernel with exact differences (``direct``) and with
   the Gram identity (``gram``: HIGHEST Gram + TF32 ``W @ X``; ``gram_x3``:
   3xTF32 Gram + TF32 ``W @ X``) against the float64 dense reference computed on the device,
   on CEnLMC-shaped ensembles (``w`` and ``log p`` as after a step), centred
   and shifted by +100 (the implementations centre internally: a shift must
   not change the errors). Reported: max and median relative force error,
   and the fraction of neighbour counts that differ (mask flips).
2. ``tune``: a few (block_rows, block_cols, num_warps) for the kernel.
3. ``throughput``: pairs/s (N² / median time) of tiled vs Pallas at
   N = 65,536, d = 100 and N = 4,096 ... 262,144, d = 10.
4. ``sparse``: the block-sparse variants (``block_sparse=True``: Hilbert
   order, tile boxes, only near tile pairs) of the tiled XLA kernel and of
   the Pallas kernel against their dense forms, at d = 2, 3, 5 and
   N = 65,536 / 262,144 with the tuned radii ``η = R2 = sqrt(h d)``
   (h = 0.05): median time, speed-up, and counts equal to the dense tiles.
   (Their correctness against float64 is in section 1: ``tiled_sparse``,
   ``pallas_sparse``.)
5. ``cenlmc_step``: one full CEnLMC step at N ≈ 10^6, d = 10
   (``method="pallas"`` when the probe passed, ``"tiled"`` otherwise), timed
   after its compilation, when the measured rates say it fits the budget.

Writes ``gpu_check.json`` and ``gpu_check.md`` into ``--out-dir``.
"""

from __future__ import annotations

import functools
import math
import sys
import time
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from _common import base_parser, time_call, write_results

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, when run from anywhere

from cenlmc_jax import pairwise  # noqa: E402
from cenlmc_jax.pairwise import ensemble_force_pallas  # noqa: E402

T0 = time.perf_counter()


def elapsed() -> float:
    return time.perf_counter() - T0


def x64():
    """Context manager enabling float64 (its home moved between JAX versions)."""
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64

    return enable_x64()


def ensemble(seed: int, n: int, d: int, *, neighbours: float = 40.0, h: float = 0.05, shift: float = 0.0):
    """A CEnLMC-shaped ensemble: x ~ N(0, I), w = x - sqrt(2h) ξ, log p = log N(x; w, 2h).

    eta is chosen so that a particle has about ``neighbours`` others within
    eta (|x_i - x_j|² ~ 2 χ²_d), r2 so that 30% of pairs are R2-neighbours.
    """
    from scipy.stats import chi2

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    xi = rng.normal(size=(n, d))
    w = x - math.sqrt(2 * h) * xi
    f = 0.5 * np.sum(x * x, axis=1)
    log_p = -0.5 * d * math.log(4 * math.pi * h) - 0.5 * np.sum(xi * xi, axis=1)
    eta = math.sqrt(2 * chi2.ppf(min(0.5, neighbours / n), d))
    r2 = math.sqrt(2 * (1 + 2 * h) * chi2.ppf(0.3, d))
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    return dict(x=f32(x + shift), f=f32(f), log_p=f32(log_p), eta=eta, w=f32(w + shift), r2=r2)


def methods(d: int):
    """name -> callable(x, f, log_p, eta, w=, r2=) for every implementation under test."""
    tf32 = jax.lax.Precision.DEFAULT
    out = {
        "tiled": lambda *a, **k: pairwise.ensemble_force(*a, method="tiled", **k),
        "pallas": lambda *a, **k: pairwise.ensemble_force(*a, method="pallas", **k),
        "tiled_sparse": lambda *a, **k: pairwise.ensemble_force(*a, method="tiled", block_sparse=True, **k),
        "pallas_sparse": lambda *a, **k: pairwise.ensemble_force(*a, method="pallas", block_sparse=True, **k),
        "pallas_direct": functools.partial(ensemble_force_pallas, distances="direct"),
        "pallas_gram": functools.partial(ensemble_force_pallas, distances="gram", precision=tf32),
        "pallas_gram_x3": functools.partial(
            ensemble_force_pallas, distances="gram", precision=tf32,
            gram_precision=jax.lax.DotAlgorithmPreset.TF32_TF32_F32_X3,
        ),
    }
    return out


def compare(result, ref) -> dict:
    force = np.asarray(result.force_sum, np.float64)
    f64 = np.asarray(ref.force_sum, np.float64)
    row_err = np.max(np.abs(force - f64), axis=1)
    row_norm = np.max(np.abs(f64), axis=1)
    has = row_norm > 0
    nb, nb64 = np.asarray(result.n_ball), np.asarray(ref.n_ball)
    nr, nr64 = np.asarray(result.n_r2), np.asarray(ref.n_r2)
    return dict(
        max_rel_err=float(np.max(row_err) / max(np.max(row_norm), 1e-300)),
        median_row_rel_err=float(np.median(row_err[has] / row_norm[has])) if has.any() else 0.0,
        p99_row_rel_err=float(np.quantile(row_err[has] / row_norm[has], 0.99)) if has.any() else 0.0,
        n_ball_flip_frac=float(np.sum(np.abs(nb - nb64)) / max(1, np.sum(nb64))),
        n_r2_flip_frac=float(np.sum(np.abs(nr - nr64)) / max(1, np.sum(nr64))),
        mean_n_ball=float(np.mean(nb64)),
        nonfinite_rows=int(np.sum(~np.all(np.isfinite(force), axis=1))),
    )


def section_probe(args, rows, payload):
    """Build the kernel (compiled on a GPU) and match it against the tiled kernel on 300 x 4 particles."""
    k1, k2 = jax.random.split(jax.random.key(0))
    x = jax.random.normal(k1, (300, 4))
    f = 0.5 * jnp.sum(x * x, axis=1)
    log_p = jax.random.normal(k2, (300,))
    row = dict(section="probe", method="pallas", N=300, d=4)
    probe = dict(ok=False)
    try:
        got = jax.block_until_ready(ensemble_force_pallas(x, f, log_p, 1.0))
        ref = pairwise.ensemble_force(x, f, log_p, 1.0, method="tiled", block_size=64)
        scale = float(jnp.max(jnp.abs(ref.force_sum))) + 1e-30
        err = float(jnp.max(jnp.abs(got.force_sum - ref.force_sum))) / scale
        same_counts = bool(jnp.all(got.n_ball == ref.n_ball))
        probe = dict(ok=err <= 1e-4 and same_counts, max_rel_err=err, n_ball_equal=same_counts)
        row.update(max_rel_err=err)
    except Exception as exc:  # a toolchain that cannot build it: recorded, the check goes on
        probe["error"] = row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    row["probe_ok"] = probe["ok"]
    payload["pallas_probe"] = probe
    rows.append(row)
    print(row, flush=True)


def section_correctness(args, rows, payload):
    cases = [(4096, 10, True), (4096, 3, True), (2048, 100, False)]
    if args.quick:
        cases = [(300, 10, True), (300, 3, False)]
    for n, d, with_w in cases:
        for shift in (0.0, 100.0):
            data = ensemble(0, n, d, shift=shift)
            kw = dict(w=data["w"], r2=data["r2"]) if with_w else {}
            args_ = (data["x"], data["f"], data["log_p"], data["eta"])
            with x64():
                ref = pairwise.ensemble_force(
                    *(np.asarray(a, np.float64) for a in args_[:3]), data["eta"], method="dense",
                    **({"w": np.asarray(data["w"], np.float64), "r2": data["r2"]} if with_w else {}),
                )  # fmt: skip
                ref = jax.tree.map(np.asarray, ref)
            for name, fn in methods(d).items():
                row = dict(section="correctness", method=name, N=n, d=d, w=with_w, shift=shift)
                try:
                    res = jax.block_until_ready(fn(*args_, **kw))
                    row.update(compare(res, ref))
                except Exception as exc:  # recorded, the check goes on
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                rows.append(row)
                print(row, flush=True)


def _time(fn, *a, repeats, **k):
    t = time_call(fn, *a, repeats=repeats, **k)
    return t.median_s, t.first_call_s


def section_tune(args, rows, payload):
    n, d = (512, 10) if args.quick else (65536, 10)
    data = ensemble(1, n, d)
    a = (data["x"], data["f"], data["log_p"], data["eta"])
    kw = dict(w=data["w"], r2=data["r2"])
    best = {}
    configs = [(64, 64, 4), (128, 64, 4), (64, 128, 4), (128, 128, 8), (32, 64, 4), (64, 32, 4), (128, 64, 8)]
    if args.quick:
        configs = configs[:2]
    for distances in ("direct", "gram"):
        for br, bc, nw in configs:
            row = dict(section="tune", method=f"pallas_{distances}", N=n, d=d, block_rows=br, block_cols=bc, num_warps=nw)
            try:
                fn = functools.partial(
                    ensemble_force_pallas, distances=distances, block_rows=br, block_cols=bc, num_warps=nw
                )
                med, first = _time(fn, *a, repeats=3, **kw)
                row.update(median_s=med, first_call_s=first, pairs_per_s=n * n / med)
                if med < best.get(distances, (math.inf,))[0]:
                    best[distances] = (med, br, bc, nw)
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            rows.append(row)
            print(row, flush=True)
    payload["best_blocks"] = {k: dict(block_rows=v[1], block_cols=v[2], num_warps=v[3]) for k, v in best.items()}


def section_throughput(args, rows, payload):
    best = payload.get("best_blocks", {})
    variants = {
        "tiled": lambda *a, **k: pairwise.ensemble_force(*a, method="tiled", **k),
        "pallas": lambda *a, **k: pairwise.ensemble_force(*a, method="pallas", **k),
        # the tiled kernel's default row block targets a CPU cache (B*N*4 = 1 MiB,
        # i.e. B = 16 rows at large N: many small sequential steps on a GPU);
        # this variant gives each step a ~1 GB (B, N) temporary instead.
        "tiled_bigblock": lambda *a, **k: pairwise.ensemble_force(
            *a, method="tiled", block_size=int(min(a[0].shape[0], max(16, 2**28 // a[0].shape[0]))), **k
        ),
        "pallas_direct": functools.partial(ensemble_force_pallas, distances="direct", **best.get("direct", {})),
        "pallas_gram": functools.partial(ensemble_force_pallas, distances="gram", precision=jax.lax.Precision.DEFAULT,
                                         **best.get("gram", {})),
    }
    sizes = [(65536, 100)] + [(n, 10) for n in (4096, 16384, 65536, 262144)]
    if args.quick:
        sizes = [(512, 100), (256, 10), (1024, 10)]
    rate = {}
    for n, d in sizes:
        data = ensemble(2, n, d)
        a = (data["x"], data["f"], data["log_p"], data["eta"])
        kw = dict(w=data["w"], r2=data["r2"])
        for name, fn in variants.items():
            row = dict(section="throughput", method=name, N=n, d=d)
            # skip what the rate measured so far says would not fit the budget
            guess = n * n / rate[(name, d)] * 5 if (name, d) in rate else 0.0
            if elapsed() + guess > args.budget_s * 0.8:
                row["skipped"] = f"predicted {guess:.0f} s"
                rows.append(row)
                continue
            try:
                med, first = _time(fn, *a, repeats=3, **kw)
                rate[(name, d)] = n * n / med
                row.update(median_s=med, first_call_s=first, pairs_per_s=n * n / med)
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            rows.append(row)
            print(row, flush=True)
    payload["pairs_per_s_d10"] = {k[0]: v for k, v in rate.items() if k[1] == 10}


def section_sparse(args, rows, payload):
    """Block-sparse vs dense tiles, XLA and Pallas, on CEnLMC-shaped ensembles with the tuned radii."""
    h = 0.05
    variants = {
        "tiled": dict(method="tiled"),
        "tiled_sparse": dict(method="tiled", block_sparse=True),
        "pallas": dict(method="pallas"),
        "pallas_sparse": dict(method="pallas", block_sparse=True),
    }
    sizes = [(65536, 2), (262144, 2), (262144, 3), (262144, 5)]
    if args.quick:
        sizes = [(2048, 2), (2048, 5)]
    rate = {}
    for n, d in sizes:
        data = ensemble(3, n, d)
        eta = r2 = math.sqrt(h * d)
        a = (data["x"], data["f"], data["log_p"], eta)
        kw = dict(w=data["w"], r2=r2)
        ref, times = None, {}
        for name, how in variants.items():
            row = dict(section="sparse", method=name, N=n, d=d, w=True)
            guess = n * n / rate[name] * 4 if name in rate else 0.0
            if elapsed() + guess > args.budget_s * 0.8:
                row["skipped"] = f"predicted {guess:.0f} s"
                rows.append(row)
                continue
            try:
                fn = jax.jit(lambda x, f, lp, w, how=how: pairwise.ensemble_force(x, f, lp, eta, w=w, r2=r2,
                                                                                  **how))
                med, first = _time(fn, a[0], a[1], a[2], kw["w"], repeats=3)
                res = fn(a[0], a[1], a[2], kw["w"])
                rate[name] = n * n / med
                times[name] = med
                row.update(median_s=med, first_call_s=first, pairs_per_s=n * n / med)
                if ref is None:
                    ref = res
                row["n_ball_rows_differ"] = int(jnp.sum(res.n_ball != ref.n_ball))
                row["n_r2_rows_differ"] = int(jnp.sum(res.n_r2 != ref.n_r2))
                dense = name.replace("_sparse", "")
                if name.endswith("_sparse") and dense in times:
                    row["speedup_vs_dense"] = times[dense] / med
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            rows.append(row)
            print(row, flush=True)


def section_cenlmc(args, rows, payload):
    from cenlmc_jax.ensemble import cenlmc_init, cenlmc_step

    n, d = (2048, 10) if args.quick else (2**20, 10)
    rates = payload.get("pairs_per_s_d10", {})
    method = "pallas" if payload.get("pallas_probe", {}).get("ok") else "tiled"
    rate = rates.get(method)
    if rate and n * n / rate * 4 > args.budget_s - elapsed():
        n = int(2 ** math.floor(math.log2(math.sqrt(rate * max(1.0, args.budget_s - elapsed()) / 4))))
    # Radii for a step where the ensemble is really used: about 40 R2- and
    # ball-neighbours per particle (pair distances² ~ 2 χ²_d), R1 passing
    # ~70% (|x - w| = sqrt(2h)|ξ|), M_f passing nearly all (f = |x|²/2, f* = 0).
    from scipy.stats import chi2

    h = 0.05
    eta = math.sqrt(2 * chi2.ppf(40 / n, d))
    r2 = math.sqrt(2 * (1 + 2 * h) * chi2.ppf(40 / n, d))
    r1 = math.sqrt(2 * h * chi2.ppf(0.7, d))
    row = dict(section="cenlmc_step", method=method, N=n, d=d, eta=eta, r1=r1, r2=r2)
    try:
        logdensity = lambda x: -0.5 * jnp.sum(x * x)  # noqa: E731
        x0 = jax.random.normal(jax.random.key(0), (n, d))
        state = cenlmc_init(x0, logdensity, f_star=0.0)
        step = jax.jit(
            functools.partial(
                cenlmc_step, logdensity_fn=logdensity, step_size=h, eta=eta, r1=r1, r2=r2,
                n_star=20, m_f=10.0, method=method,
            )
        )  # fmt: skip
        keys = jax.random.split(jax.random.key(1), 4)
        t0 = time.perf_counter()
        state, info = jax.block_until_ready(step(keys[0], state))  # step 0: compile, true gradients
        row["first_step_s"] = time.perf_counter() - t0
        times = []
        for k in keys[1:3]:
            t0 = time.perf_counter()
            state, info = jax.block_until_ready(step(k, state))
            times.append(time.perf_counter() - t0)
        row.update(step_s=float(np.median(times)), pairs_per_s=n * n / float(np.median(times)))
        row.update({k: np.asarray(v).tolist() for k, v in info._asdict().items() if np.asarray(v).size == 1})
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        traceback.print_exc()
    rows.append(row)
    print(row, flush=True)


def main():
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=420.0, help="skip remaining sections after this many seconds")
    parser.add_argument("--sections", default="probe,correctness,tune,throughput,sparse,cenlmc_step")
    args = parser.parse_args()
    out_dir = args.out_dir
    print("devices:", jax.devices(), "jax", jax.__version__, flush=True)
    rows: list = []
    payload: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "sections": {}}
    sections = dict(
        probe=section_probe,
        correctness=section_correctness, tune=section_tune, throughput=section_throughput, sparse=section_sparse,
        cenlmc_step=section_cenlmc,
    )
    for name in args.sections.split(","):
        if elapsed() > args.budget_s:
            payload["sections"][name] = "skipped: budget spent"
            continue
        t = time.perf_counter()
        try:
            sections[name](args, rows, payload)
            payload["sections"][name] = f"done in {time.perf_counter() - t:.1f} s"
        except Exception as exc:  # a whole section failed: record it, go on
            payload["sections"][name] = f"failed: {type(exc).__name__}: {str(exc)[:300]}"
            traceback.print_exc()
        # write after every section: a run killed later still leaves its results
        write_results(
            "gpu_check", payload, rows, out_dir=out_dir, title="GPU check of the ensemble force",
            columns=["section", "method", "N", "d", "w", "shift", "probe_ok", "block_rows", "block_cols", "num_warps",
                     "max_rel_err", "median_row_rel_err", "n_ball_flip_frac", "n_r2_flip_frac", "median_s",
                     "pairs_per_s", "speedup_vs_dense", "n_ball_rows_differ", "step_s", "grad_evals", "error",
                     "skipped"],
            notes=[
                "rel_err: |force - float64 dense| / max|float64 force| (max), per row (median).",
                "flip_frac: sum |n - n_float64| / sum n_float64 over rows (mask decisions that differ).",
                "pairs_per_s = N^2 / median time of 3 blocked calls after a warm-up call.",
                f"total wall time {elapsed():.0f} s.",
            ],
        )  # fmt: skip
    print(payload["sections"], flush=True)


if __name__ == "__main__":
    main()
