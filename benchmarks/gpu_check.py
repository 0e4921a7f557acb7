"""GPU check: the headline figures first, compile times apart, correctness against
float64 on the device.

Run on a CUDA machine through ``bash benchmarks/gpu_check.sh [OUT_DIR]`` (it
records what is installed and finds a GPU JAX), or directly:

    python benchmarks/gpu_check.py --out-dir DIR [--budget-s 420]
    # CPU smoke run, < 3 min
    python benchmarks/gpu_check.py --smoke --backend cpu --out-dir DIR

The first thing it does is check that ``jax.default_backend()`` is
``--backend`` (default ``gpu``): otherwise it writes ``env.json`` and exits
with status 2 before any work (a failed CUDA install would else time the
Pallas interpreter on the CPU). ``--smoke`` keeps the sections and shrinks
every shape; it still fails on a backend other than the requested one.

Sections, most important first (each guarded: an exception is recorded and
the script goes on; after ``--budget-s`` the rest are recorded as skipped).
Every timed call gets device-resident inputs (``jax.device_put`` before the
clock) and its compile time is measured apart (``.lower().compile()``) from
the median of the timed runs:

1. ``probe``: the Pallas kernel builds here and matches the tiled XLA kernel
   (forces to 1e-4 of their scale, equal ball counts) on 300 x 4 particles.
2. ``headline``: the force at N = 65,536, d = 100 (tiled vs Pallas) and at
   N = 2^20, d = 2 (block-sparse tiled vs block-sparse Pallas), CEnLMC-shaped
   ensembles with about 40 ball neighbours per particle.
3. ``sample``: full ``cj.sample`` CEnLMC jobs (``mode="stream"``) at
   N = 2^20, d = 2 (block-sparse) and N = 65,536, d = 100, with the XLA tiles
   and, if the probe passed, the Pallas kernel: first chunk (compile + run)
   apart, then the seconds per step of a second run that reuses the compiled
   chunk. The goal: <= 100 ms and <= 10 ms per step.
4. ``correctness``: ``ensemble_force`` tiled, Pallas (and block-sparse at
   d = 3) against the float64 dense reference computed on the device.

Writes ``gpu_check.json`` / ``gpu_check.md`` (and ``env.json``) into
``--out-dir`` after every section, so a run cut short leaves its results.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import sys
import time
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(
    0, str(Path(__file__).resolve().parent)
)  # _common, when run from anywhere
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository

from _common import machine_info, write_results  # noqa: E402

T0 = time.perf_counter()
STEP_GOAL_S = {
    (2**20, 2): 0.100,
    (65536, 100): 0.010,
}  # issue 16's goals for one whole CEnLMC step


def elapsed() -> float:
    return time.perf_counter() - T0


def environment() -> dict:
    """What this run uses: JAX and its plugins, devices, the library's own deps."""
    from importlib import metadata

    versions = {}
    for dist in (
        "jax",
        "jaxlib",
        "jax-cuda12-plugin",
        "jax-cuda12-pjrt",
        "jax-cuda13-plugin",
        "jax-cuda13-pjrt",
        "numpy",
        "scipy",
        "optax",
        "chex",
        "triton",
    ):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return dict(
        machine=machine_info(),
        versions=versions,
        python=sys.version,
        devices=[str(d) for d in jax.devices()],
    )


def x64():
    """Context manager enabling float64 (its home moved between JAX versions)."""
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64

    return enable_x64()


def ensemble(seed: int, n: int, d: int, *, neighbours: float = 40.0, h: float = 0.05):
    """A CEnLMC-shaped ensemble on the device: x ~ N(0, I), w = x - sqrt(2h) ξ, log p =
    log N(x; w, 2h) + const.

    eta: about ``neighbours`` others within eta (|x_i - x_j|² ~ 2 χ²_d); r2
    the same count in w (|w_i - w_j|² ~ 2 (1 + 2h) χ²_d).
    """
    from scipy.stats import chi2

    k1, k2 = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(k1, (n, d))
    xi = jax.random.normal(k2, (n, d))
    w = x - math.sqrt(2 * h) * xi
    f = 0.5 * jnp.sum(x * x, axis=1)
    log_p = -0.5 * d * math.log(4 * math.pi * h) - 0.5 * jnp.sum(xi * xi, axis=1)
    q = chi2.ppf(min(0.5, neighbours / n), d)
    eta, r2 = math.sqrt(2 * q), math.sqrt(2 * (1 + 2 * h) * q)
    # Shift log p by a constant so that the weights α_d / p_j are O(1): at
    # d = 100 this eta's ball has volume ~e^170 and the unshifted forces lie
    # below float32's range (an honest 0 against float64's e^-140). A common
    # shift scales every force by one factor and changes no mask.
    from cenlmc_jax.pairwise import log_alpha_d

    log_p = log_p - jnp.mean(log_p) + log_alpha_d(d, eta, jnp.float32)
    arrays = jax.block_until_ready(jax.device_put((x, f, log_p, w)))
    return dict(zip(("x", "f", "log_p", "w"), arrays, strict=True), eta=eta, r2=r2)


def timed(fn, *args, repeats: int = 3) -> dict:
    """Compile ``jax.jit(fn)`` for ``args`` (timed apart), one warm-up call, then the
    median of ``repeats``."""
    t = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - t
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t)
    return dict(
        compile_s=compile_s, median_s=float(np.median(times)), min_s=float(min(times))
    ), out


def force_fn(how: dict, eta: float, r2: float):
    from cenlmc_jax import pairwise

    return lambda x, f, lp, w: pairwise.ensemble_force(x, f, lp, eta, w=w, r2=r2, **how)


def section_probe(args, rows, payload):
    from cenlmc_jax import pairwise

    k1, k2 = jax.random.split(jax.random.key(0))
    x = jax.random.normal(k1, (300, 4))
    f = 0.5 * jnp.sum(x * x, axis=1)
    log_p = jax.random.normal(k2, (300,))
    row = dict(section="probe", method="pallas", N=300, d=4)
    probe = dict(ok=False)
    try:
        got = jax.block_until_ready(pairwise.ensemble_force_pallas(x, f, log_p, 1.0))
        ref = pairwise.ensemble_force(x, f, log_p, 1.0, method="tiled", block_size=64)
        scale = float(jnp.max(jnp.abs(ref.force_sum))) + 1e-30
        # 1e-4 of the scale: float32 sums of a few hundred terms in another
        # order; a wrong mask or weight moves a row by a whole pair term (~1e-2)
        err = float(jnp.max(jnp.abs(got.force_sum - ref.force_sum))) / scale
        same = bool(jnp.all(got.n_ball == ref.n_ball))
        probe = dict(ok=err <= 1e-4 and same, max_rel_err=err, n_ball_equal=same)
        row.update(max_rel_err=err)
    except (
        Exception
    ) as exc:  # a toolchain that cannot build it: recorded, the check goes on
        probe["error"] = row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    row["probe_ok"] = probe["ok"]
    payload["pallas_probe"] = probe
    rows.append(row)
    print(row, flush=True)


def section_headline(args, rows, payload):
    cases = [
        (
            (65536, 100),
            [("tiled", dict(method="tiled")), ("pallas", dict(method="pallas"))],
        ),
        (
            (2**20, 2),
            [
                ("tiled_sparse", dict(method="tiled", block_sparse=True)),
                ("pallas_sparse", dict(method="pallas", block_sparse=True)),
            ],
        ),
    ]
    if args.smoke:
        cases = [((512, 100), cases[0][1]), ((2048, 2), cases[1][1])]
    for (n, d), variants in cases:
        data = ensemble(2, n, d)
        ref = None
        for name, how in variants:
            row = dict(section="headline", method=name, N=n, d=d)
            if budget_left(args) < 30:
                row["skipped"] = "budget"
                rows.append(row)
                continue
            try:
                t, out = timed(
                    force_fn(how, data["eta"], data["r2"]),
                    data["x"],
                    data["f"],
                    data["log_p"],
                    data["w"],
                )
                row.update(
                    t,
                    pairs_per_s=n * n / t["median_s"],
                    mean_n_ball=float(jnp.mean(out.n_ball)),
                )
                if ref is None:
                    ref = out
                # same counts as the first variant: a cheap check that both computed the
                # same thing
                else:
                    row["n_ball_rows_differ"] = int(jnp.sum(out.n_ball != ref.n_ball))
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            rows.append(row)
            print(row, flush=True)


def sample_job(n: int, d: int, h: float, method: str, sparse: bool):
    """The ``sample`` section's CEnLMC on a standard Gaussian: about 40 R2
    neighbours per particle, R1 passing ~70%, M_f nearly all (f* = 0).

    Returns ``(algorithm, eta, r2)``."""
    from scipy.stats import chi2

    import cenlmc_jax as cj

    q = chi2.ppf(40 / n, d)
    eta, r2 = math.sqrt(2 * q), math.sqrt(2 * (1 + 2 * h) * q)
    r1 = math.sqrt(2 * h * chi2.ppf(0.7, d))
    alg = cj.cenlmc(
        lambda x: -0.5 * jnp.sum(x * x),
        h,
        eta,
        r1,
        r2,
        20,
        10.0,
        f_star=0.0,
        method=method,
        block_sparse=sparse,
    )
    return alg, eta, r2


def section_sample(args, rows, payload):
    import cenlmc_jax as cj

    # the XLA tiles (what method="auto" runs) always, the Pallas kernel if it built
    methods = ["tiled"] + (
        ["pallas"] if payload.get("pallas_probe", {}).get("ok") else []
    )
    jobs = [(2**20, 2, True), (65536, 100, False)]
    steps = 20
    if args.smoke:
        jobs, steps = [(2048, 2, True), (256, 100, False)], 4
    h = 0.05
    for (n, d, sparse), method in itertools.product(jobs, methods):
        row = dict(
            section="sample",
            method=method + ("_sparse" if sparse else ""),
            N=n,
            d=d,
            steps=steps,
        )
        if budget_left(args) < 60:
            row["skipped"] = "budget"
            rows.append(row)
            continue
        try:
            alg, _, _ = sample_job(n, d, h, method, sparse)
            x0 = jax.device_put(jax.random.normal(jax.random.key(0), (n, d)))
            state = jax.block_until_ready(alg.init(x0))
            key = jax.random.key(1)
            run = functools.partial(
                cj.sample, key, alg, mode="stream", chunk_size=steps
            )
            t = time.perf_counter()
            first = run(
                state, steps
            )  # compiles the chunk; step 0 takes every true gradient (w = inf)
            jax.block_until_ready(first.state)
            row["first_chunk_s"] = time.perf_counter() - t
            t = time.perf_counter()
            again = run(first.state, steps)  # the same chunk function: no compile
            jax.block_until_ready(again.state)
            step_s = (time.perf_counter() - t) / steps
            goal = STEP_GOAL_S.get((n, d))
            row.update(
                step_s=step_s,
                goal_s=goal,
                meets_goal=None if goal is None else step_s <= goal,
                grad_evals=float(np.mean(np.asarray(again.info.grad_evals))),
                diverged_at=int(again.diverged_at),
                dense_fallback_steps=int(np.sum(np.asarray(again.info.dense_fallback))),
            )
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            traceback.print_exc()
        rows.append(row)
        print(row, flush=True)


def compare(result, ref) -> dict:
    force = np.asarray(result.force_sum, np.float64)
    f64 = np.asarray(ref.force_sum, np.float64)
    row_err = np.max(np.abs(force - f64), axis=1)
    row_norm = np.max(np.abs(f64), axis=1)
    has = row_norm > 0
    nb, nb64 = np.asarray(result.n_ball), np.asarray(ref.n_ball)
    return dict(
        max_rel_err=float(np.max(row_err) / max(np.max(row_norm), 1e-300)),
        median_row_rel_err=float(np.median(row_err[has] / row_norm[has]))
        if has.any()
        else 0.0,
        n_ball_flip_frac=float(np.sum(np.abs(nb - nb64)) / max(1, np.sum(nb64))),
        n_r2_flip_frac=float(
            np.sum(np.abs(np.asarray(result.n_r2) - np.asarray(ref.n_r2)))
            / max(1, np.sum(np.asarray(ref.n_r2)))
        ),
        mean_n_ball=float(np.mean(nb64)),
        nonfinite_rows=int(np.sum(~np.all(np.isfinite(force), axis=1))),
    )


def section_correctness(args, rows, payload):
    from cenlmc_jax import pairwise

    # the float64 dense reference builds (N, N, d) differences on the device: N = 2048
    # at d = 100 is 3.4 GB
    cases = [(4096, 3, True), (4096, 10, True), (2048, 100, False)]
    if args.smoke:
        cases = [(300, 3, True), (200, 100, False)]
    variants = {
        "tiled": dict(method="tiled"),
        "pallas": dict(method="pallas"),
        "tiled_sparse": dict(method="tiled", block_sparse=True),
        "pallas_sparse": dict(method="pallas", block_sparse=True),
    }
    for n, d, with_w in cases:
        data = ensemble(0, n, d)
        kw = dict(w=data["w"], r2=data["r2"]) if with_w else {}
        a = (data["x"], data["f"], data["log_p"], data["eta"])
        with x64():
            ref = pairwise.ensemble_force(
                *(jnp.asarray(v, jnp.float64) for v in a[:3]),
                a[3],
                method="dense",
                **(
                    {"w": jnp.asarray(data["w"], jnp.float64), "r2": data["r2"]}
                    if with_w
                    else {}
                ),
            )
            ref = jax.tree.map(np.asarray, ref)
        for name, how in variants.items():
            if "sparse" in name and d > 3:
                continue
            row = dict(section="correctness", method=name, N=n, d=d, w=with_w)
            try:
                res = jax.block_until_ready(pairwise.ensemble_force(*a, **kw, **how))
                row.update(compare(res, ref))
                # ok: float32 sums of ~40 ball terms are good to ~1e-5 of the force
                # scale (d = 100, Gram distances); a wrong mask or weight moves a row by
                # a whole pair term, ~1e-2 of it; mask flips only for pairs within
                # rounding of a radius (~1e-4 of the counts at most)
                row["ok"] = (
                    row["max_rel_err"] <= 1e-3
                    and row["n_ball_flip_frac"] <= 1e-3
                    and row["n_r2_flip_frac"] <= 1e-3
                    and row["nonfinite_rows"] == 0
                )
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            rows.append(row)
            print(row, flush=True)


SECTIONS = dict(
    probe=section_probe,
    headline=section_headline,
    sample=section_sample,
    correctness=section_correctness,
)
COLUMNS = [
    "section",
    "method",
    "N",
    "d",
    "w",
    "probe_ok",
    "ok",
    "compile_s",
    "median_s",
    "pairs_per_s",
    "first_chunk_s",
    "step_s",
    "goal_s",
    "meets_goal",
    "grad_evals",
    "dense_fallback_steps",
    "max_rel_err",
    "median_row_rel_err",
    "n_ball_flip_frac",
    "n_r2_flip_frac",
    "n_ball_rows_differ",
    "error",
    "skipped",
]


def budget_left(args) -> float:
    return args.budget_s - elapsed()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=" ".join(__doc__.split("\n\n")[0].split())
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=Path(__file__).resolve().parent / "results" / "gpu",
    )
    parser.add_argument(
        "--backend", default="gpu", help="the backend this run must find (default gpu)"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="every shape small: a quick end-to-end run"
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=420.0,
        help="skip the remaining sections after this",
    )
    parser.add_argument("--sections", default=",".join(SECTIONS))
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    env = environment()
    backend = jax.default_backend()
    env["requested_backend"] = args.backend
    (args.out_dir / "env.json").write_text(
        json.dumps(env, indent=2, default=str) + "\n"
    )
    print("devices:", env["devices"], "versions:", env["versions"], flush=True)
    if backend != args.backend:
        print(
            f"FAIL: jax.default_backend() is {backend!r}, not the requested "
            f"{args.backend!r} (devices {env['devices']}); nothing was measured.",
            file=sys.stderr,
            flush=True,
        )
        return 2

    rows: list = []
    payload: dict = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "sections": {},
        "versions": env["versions"],
    }
    for name in args.sections.split(","):
        if budget_left(args) <= 0:
            payload["sections"][name] = "skipped: budget spent"
            continue
        t = time.perf_counter()
        try:
            SECTIONS[name](args, rows, payload)
            payload["sections"][name] = f"done in {time.perf_counter() - t:.1f} s"
        except Exception as exc:  # a whole section failed: record it, go on
            payload["sections"][name] = (
                f"failed: {type(exc).__name__}: {str(exc)[:300]}"
            )
            traceback.print_exc()
        write_results(
            "gpu_check",
            payload,
            rows,
            columns=COLUMNS,
            out_dir=args.out_dir,
            title="GPU check: headline figures, CEnLMC jobs, correctness against "
            "float64",
            notes=[
                "compile_s: jax.jit(fn).lower(args).compile(), apart; median_s: 3 "
                "blocked calls on device-resident inputs after a warm-up; pairs_per_s "
                "= N^2 / median_s.",
                "sample: first_chunk_s includes the compile; step_s = a second "
                "cj.sample run of the same chunk (no compile) / its steps; goal_s: "
                "issue 16's target for the whole step.",
                "rel_err: |force - float64 dense| / max|float64 force| (max), per row "
                "(median); flip_frac: sum |n - n_float64| / sum n_float64 (mask "
                "decisions that differ).",
                f"backend {backend}; total wall time {elapsed():.0f} s"
                + (" (smoke: small shapes)" if args.smoke else ""),
            ],
        )
    print(payload["sections"], flush=True)
    failed = [k for k, v in payload["sections"].items() if v.startswith("failed")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
