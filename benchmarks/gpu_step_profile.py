"""Where a CEnLMC step's time goes on the device: per-step times, the step's
info (dense fallback, neighbour counts), the pair force alone, and the top
kernels of a ``jax.profiler`` trace.

    python benchmarks/gpu_step_profile.py --n 1048576 --methods tiled pallas \
        --out-dir DIR [--budget-s 300]

The ensemble is ``gpu_check.py``'s ``sample`` job (d = 2, block-sparse, about
40 R2 neighbours per particle, f* = 0). Writes ``step_profile.json`` and
``step_profile.md`` into ``--out-dir``.
"""

from __future__ import annotations

import argparse
import collections
import functools
import glob
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _common
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository

from gpu_check import sample_job  # noqa: E402

T0 = time.perf_counter()
INFO = (
    "dense_fallback",
    "mean_num_neighbours",
    "mean_ball_neighbours",
    "ensemble_fraction",
    "grad_evals",
    "lookahead_misses",
)


def build(n: int, d: int, method: str):
    """``gpu_check.py``'s ``sample`` job, block-sparse, and its eta and R2."""
    return sample_job(n, d, 0.05, method, True)


def print_events(prefix: str, events: list) -> None:
    for ev in events:
        where = " | ".join((ev["plane"], ev["line"], ev["event"]))
        print(prefix, f"{ev['ms_per_step']:9.3f} ms/step {ev['count']:7d}", where)


def top_events(fn, steps: int, k: int = 25) -> list:
    """The ``k`` events with the most total time in a trace of ``fn()``."""
    from jax.profiler import ProfileData

    where = tempfile.mkdtemp()
    with jax.profiler.trace(where):
        fn()
    files = glob.glob(f"{where}/**/*.xplane.pb", recursive=True)
    tot, cnt = collections.Counter(), collections.Counter()
    for plane in ProfileData.from_file(files[0]).planes:
        for line in plane.lines:
            for ev in line.events:
                key = (plane.name[-30:], line.name[-30:], ev.name[:90])
                tot[key] += ev.duration_ns
                cnt[key] += 1
    shutil.rmtree(where, ignore_errors=True)
    return [
        dict(
            plane=p,
            line=li,
            event=e,
            ms_per_step=v / 1e6 / steps,
            count=cnt[(p, li, e)],
        )
        for (p, li, e), v in tot.most_common()
        if "host" not in p or "python" not in li
    ][:k]


def profile(n: int, d: int, method: str, timed_steps: int) -> dict:
    from cenlmc_jax.pairwise import ensemble_force

    alg, eta, r2 = build(n, d, method)
    out: dict = dict(method=method, N=n, d=d)
    x0 = jax.device_put(jax.random.normal(jax.random.key(0), (n, d)))
    state = jax.block_until_ready(alg.init(x0))
    step = jax.jit(alg.step)
    keys = jax.random.split(jax.random.key(1), timed_steps + 3)
    t = time.perf_counter()
    state, _ = jax.block_until_ready(step(keys[0], state))  # step 0 + compile
    out["compile_and_step0_s"] = time.perf_counter() - t
    steps = []
    for i in range(1, timed_steps + 1):
        t = time.perf_counter()
        state, info = jax.block_until_ready(step(keys[i], state))
        row = dict(step=i, s=time.perf_counter() - t)
        row.update({f: float(np.asarray(getattr(info, f))) for f in INFO})
        steps.append(row)
        print(method, row, flush=True)
    out["steps"] = steps
    out["median_step_s"] = float(np.median([r["s"] for r in steps[1:]]))
    # the pair force alone, on the step's own arguments
    kw = dict(method=method, block_sparse=True)  # as the step builds it
    force = jax.jit(
        lambda x, f, lp, w: ensemble_force(
            x,
            f,
            lp,
            jnp.asarray(eta, x.dtype),
            w=w,
            r2=jnp.asarray(r2, x.dtype),
            return_fallback=True,
            **kw,
        )
    )
    args = (state.position, -state.logdensity, state.log_p, state.w)
    res = jax.block_until_ready(force(*args))
    times = []
    for _ in range(3):
        t = time.perf_counter()
        res = jax.block_until_ready(force(*args))
        times.append(time.perf_counter() - t)
    out["force_alone_s"] = float(np.median(times))
    out["force_fallback"] = str(jax.tree.map(lambda a: np.asarray(a).tolist(), res[1]))
    print(
        method, "force alone", out["force_alone_s"], out["force_fallback"], flush=True
    )
    holder = {"s": state}

    def two():
        s = holder["s"]
        for i in range(2):
            s, _ = step(keys[timed_steps + 1 + i], s)
        jax.block_until_ready(s)

    out["top_events"] = top_events(two, 2)
    print_events(method, out["top_events"])
    return out


def sweep_pallas(n: int, d: int) -> list:
    """The Pallas pair force at (n, d) under tile sizes, warps and precisions,
    beside the XLA tiles: seconds per call (median of 3 after a warm-up)."""
    from cenlmc_jax.pairwise import ensemble_force

    k1, k2 = jax.random.split(jax.random.key(0))
    x = jax.random.normal(k1, (n, d))
    f = 0.5 * jnp.sum(x * x, axis=1)
    lp = jax.random.normal(k2, (n,))
    eta = float(np.sqrt(2 * d) * 0.5)
    from cenlmc_jax.pairwise import ensemble_force_pallas

    variants = [("tiled", functools.partial(ensemble_force, method="tiled"))]
    grid = [
        ("direct", 32, 32, 8, None),
        ("gram", 32, 32, 8, None),
        ("gram", 64, 32, 8, None),
        ("gram", 64, 64, 4, None),
        ("gram", 128, 64, 8, None),
        ("gram", 64, 64, 4, "default"),
        ("gram", 128, 64, 8, "default"),
        ("gram", 128, 128, 8, "default"),
    ]
    for dist, br, bc, nw, prec in grid:
        variants.append(
            (
                f"pallas {dist} {br}x{bc} w{nw} {prec or 'highest'}",
                functools.partial(
                    ensemble_force_pallas,
                    distances=dist,
                    block_rows=br,
                    block_cols=bc,
                    num_warps=nw,
                    precision=prec,
                    gram_precision=prec,
                ),
            )
        )
    rows = []
    for name, force in variants:
        try:
            fn = jax.jit(lambda x, f, lp, force=force: force(x, f, lp, eta))
            t = time.perf_counter()
            ref = jax.block_until_ready(fn(x, f, lp))
            first = time.perf_counter() - t
            times = []
            for _ in range(3):
                t = time.perf_counter()
                jax.block_until_ready(fn(x, f, lp))
                times.append(time.perf_counter() - t)
            row = dict(
                variant=name,
                N=n,
                d=d,
                first_s=first,
                median_s=float(np.median(times)),
                mean_n_ball=float(jnp.mean(ref.n_ball)),
            )
        except Exception as exc:
            row = dict(variant=name, error=f"{type(exc).__name__}: {exc}"[:300])
        rows.append(row)
        print("sweep", row, flush=True)
    return rows


def sample_profile(n: int, d: int, method: str, steps: int, out_dir: Path) -> dict:
    """``cj.sample`` (stream mode, one chunk) against a jitted ``lax.scan`` of the
    same steps; the second ``cj.sample`` call under cProfile and a device trace."""
    import cProfile
    import io
    import pstats

    import cenlmc_jax as cj

    alg, _, _ = build(n, d, method)
    x0 = jax.device_put(jax.random.normal(jax.random.key(0), (n, d)))
    state = jax.block_until_ready(alg.init(x0))
    out: dict = dict(method=method, N=n, d=d, steps=steps)

    @jax.jit
    def scan(s, key):
        return jax.lax.scan(
            lambda s, k: (alg.step(k, s)[0], None), s, jax.random.split(key, steps)
        )[0]

    s1 = jax.block_until_ready(scan(state, jax.random.key(1)))
    t = time.perf_counter()
    jax.block_until_ready(scan(s1, jax.random.key(2)))
    out["scan_step_s"] = (time.perf_counter() - t) / steps
    print("scan step_s", out["scan_step_s"], flush=True)
    run = functools.partial(
        cj.sample, jax.random.key(1), alg, mode="stream", chunk_size=steps
    )
    t = time.perf_counter()
    first = run(state, steps)
    jax.block_until_ready(first.state)
    out["sample_first_s"] = time.perf_counter() - t
    print("sample first", out["sample_first_s"], flush=True)
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    again = run(first.state, steps)
    jax.block_until_ready(again.state)
    prof.disable()
    out["sample_step_s"] = (time.perf_counter() - t) / steps
    print("sample step_s", out["sample_step_s"], flush=True)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(45)
    (out_dir / "sample_cprofile.txt").write_text(buf.getvalue())
    print(buf.getvalue()[:5000], flush=True)
    (out_dir / "sample_profile.json").write_text(json.dumps(out, indent=1) + "\n")
    out["sample_top_events"] = top_events(
        lambda: jax.block_until_ready(run(again.state, steps).state), steps, k=30
    )
    print_events("sample", out["sample_top_events"])
    return out


def list_lengths(n: int, d: int, steps: int) -> list:
    """Per step of the XLA-tiles run, the longest Pallas tile list a row block
    needs against the static list length: where the Pallas kernel hands the call
    to the XLA tiles (before: to its dense kernel)."""
    from cenlmc_jax.pairwise import pallas as P
    from cenlmc_jax.pairwise.algebra import prepare
    from cenlmc_jax.pairwise.sparsity import sort_spatially

    alg, eta, r2 = build(n, d, "tiled")
    state = alg.init(jax.random.normal(jax.random.key(0), (n, d)))
    step = jax.jit(alg.step)
    keys = jax.random.split(jax.random.key(1), steps + 1)
    opts = P.kernel_options(d)
    k = P.sparse_list_len(n, opts)

    @jax.jit
    def need(x, f, lp, w):
        p = prepare(x, f, lp, jnp.asarray(eta, x.dtype), w, jnp.asarray(r2, x.dtype))
        (_, n_full, n_count), _ = P.sparse_tile_lists(sort_spatially(p)[1], opts, k)
        return n_full + n_count

    rows = []
    for i in range(steps + 1):
        state, _ = step(keys[i], state)
        if i == 0:
            continue  # step 0 computes no pair force
        lens = np.asarray(need(state.position, -state.logdensity, state.log_p, state.w))
        row = dict(step=i, list_len=k, longest=int(lens.max()))
        row["overflowing_blocks"] = int((lens > k).sum())
        rows.append(row)
        print("lists", row, flush=True)
    return rows


def write_table(results: dict, out_dir: Path) -> None:
    """``step_profile.json`` and a readable ``step_profile.md``: one row per
    timed step, per pair force alone and per sweep variant."""
    from _common import write_results

    rows = []
    for run in results["runs"]:
        for r in run.get("steps", []):
            rows.append(dict(what="step", method=run["method"], **r))
        if "force_alone_s" in run:
            rows.append(
                dict(
                    what="force alone",
                    method=run["method"],
                    s=run["force_alone_s"],
                )
            )
        if "error" in run or "skipped" in run:
            rows.append(
                dict(what=run.get("error") or run.get("skipped"), method=run["method"])
            )
    for r in results.get("lists", []):
        rows.append(dict(what="pallas lists", method="tiled", **r))
    for r in results.get("sweep", []):
        rows.append(dict(what="sweep", method=r.get("variant"), **r))
    write_results(
        "step_profile",
        results,
        rows,
        columns=["what", "method", "step", "s", "median_s", "dense_fallback"]
        + ["list_len", "longest", "overflowing_blocks"]
        + ["mean_num_neighbours", "ensemble_fraction", "mean_n_ball", "error"],
        out_dir=out_dir,
        title="Where a CEnLMC step's time goes on the device",
        notes=["top kernels per method: the JSON's runs[].top_events"],
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=2**20)
    p.add_argument("--d", type=int, default=2)
    p.add_argument("--methods", nargs="*", default=["tiled", "pallas"])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--budget-s", type=float, default=300.0)
    p.add_argument("--out-dir", type=Path, default=Path("benchmarks/results/gpu"))
    p.add_argument(
        "--sweep",
        type=int,
        nargs=2,
        metavar=("N", "D"),
        default=None,
        help="also sweep the Pallas tiles at this (N, d)",
    )
    p.add_argument(
        "--sample",
        action="store_true",
        help="profile cj.sample against a jitted scan instead",
    )
    p.add_argument(
        "--lists",
        type=int,
        default=0,
        metavar="STEPS",
        help="also run STEPS steps and record the Pallas tile lists' lengths",
    )
    a = p.parse_args(argv)
    if a.sample:
        a.out_dir.mkdir(parents=True, exist_ok=True)
        res = sample_profile(a.n, a.d, a.methods[0], a.steps, a.out_dir)
        (a.out_dir / "sample_profile.json").write_text(json.dumps(res, indent=1) + "\n")
        return 0
    a.out_dir.mkdir(parents=True, exist_ok=True)
    results = dict(backend=jax.default_backend(), jax=jax.__version__, runs=[])
    for m in a.methods:
        if time.perf_counter() - T0 > a.budget_s:
            results["runs"].append(dict(method=m, skipped="budget"))
            continue
        try:
            results["runs"].append(profile(a.n, a.d, m, a.steps))
        except Exception as exc:  # recorded; the next method still runs
            results["runs"].append(
                dict(method=m, error=f"{type(exc).__name__}: {exc}"[:500])
            )
            print(m, "failed", exc, flush=True)
        (a.out_dir / "step_profile.json").write_text(
            json.dumps(results, indent=1) + "\n"
        )
    if a.sweep:
        results["sweep"] = sweep_pallas(*a.sweep)
    if a.lists:
        results["lists"] = list_lengths(a.n, a.d, a.lists)
    write_table(results, a.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
