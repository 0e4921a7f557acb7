"""Compile time of ``cj.langevin_warmup``'s programs against the model's gradient (issue
48).

A model written with its recursion as a Python loop is a long chain of scalar
operations; XLA compiles it slowly, and a warm-up program that holds the model in a
heavier form (a Hessian, several copies in one while loop, vmapped over starts and
step lengths) compiles many times more slowly than ``jax.jit(jax.grad(logp))``.
Here, per model and dimension, in one fresh process: the compile time of
``jax.jit(jax.grad(logp))``, then every XLA compilation the default warm-up
(``cj.langevin_warmup(key, logp, x0)``: HMC, Laplace start) makes, read from
``jax.monitoring``'s backend-compile events (each names its program), and the ratio of
each program's compile time to the gradient's.

Models (data from fixed seeds):

* ``hier``: a non-centred hierarchical normal model, ``J = d − 2`` groups of 5
  observations, ``y_jk ~ N(μ + τ z_j, 1)``, ``z_j ~ N(0, 1)``, ``μ ~ N(0, 5²)``,
  ``log τ ~ N(0, 1)``; vectorised.
* ``sv_loop``: stochastic volatility, ``T = d − 3`` log-variances
  ``h_t = μ + φ (h_{t−1} − μ) + σ z_t`` (non-centred), ``y_t ~ N(0, e^{h_t})``,
  ``φ = tanh(u)``, ``σ = e^s``; the recursion a Python loop (issue 48's model: ``T``
  steps unrolled into the program).
* ``sv_scan``: the same with ``lax.scan``.

``python benchmarks/bench_compile_scale.py`` (``--quick``: hier d = 10, 100, sv d = 30)
writes benchmarks/results/compile_scale.{json,md}; ``--label`` tags the rows (e.g.
``before``/``after``) and ``--append`` adds them to the existing file's rows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import base_parser, write_results  # noqa: E402

CHILD = r"""
import json, sys, time
from collections import defaultdict
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

jax.config.update("jax_enable_x64", True)
import cenlmc_jax as cj

model, d, n, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
events = []
EV = {
    "/jax/core/compile/backend_compile_duration": "compile",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
}


def listen(event, secs, fun_name="?", **kw):
    if event in EV:
        events.append((EV[event], fun_name, secs))
        # as they come, for a case cut off by the timeout
        print(json.dumps([EV[event], fun_name, secs]), file=sys.stderr, flush=True)


jax.monitoring.register_event_duration_secs_listener(listen)


def hier(d):
    j = d - 2
    rng = np.random.default_rng(0)
    z = rng.normal(size=j)
    y = jnp.asarray(1.0 + 0.8 * z[:, None] + rng.normal(size=(j, 5)))

    def logp(x):
        mu, ltau, z = x[0], x[1], x[2:]
        theta = mu + jnp.exp(ltau) * z
        return (
            -0.5 * mu**2 / 25.0
            - 0.5 * ltau**2
            - 0.5 * jnp.sum(z**2)
            - 0.5 * jnp.sum((y - theta[:, None]) ** 2)
        )

    return logp


def sv(d, loop):
    t = d - 3
    rng = np.random.default_rng(1)
    h = np.zeros(t)
    h[0] = -1.0 + 0.25 / np.sqrt(1 - 0.95**2) * rng.normal()
    for i in range(1, t):
        h[i] = -1.0 + 0.95 * (h[i - 1] + 1.0) + 0.25 * rng.normal()
    y = jnp.asarray(rng.normal(size=t) * np.exp(h / 2))

    def logp(x):
        mu, u, s, z = x[0], x[1], x[2], x[3:]
        phi, sigma = jnp.tanh(u), jnp.exp(s)
        lp = (
            -0.5 * mu**2 / 25.0
            + jnp.log1p(-(phi**2))
            - 0.5 * (u / 2.0) ** 2
            + s
            - 0.5 * sigma**2
            - 0.5 * jnp.sum(z**2)
        )
        h0 = mu + sigma * z[0] / jnp.sqrt(1.0 - phi**2)
        if loop:
            hs = [h0]
            for i in range(1, t):
                hs.append(mu + phi * (hs[-1] - mu) + sigma * z[i])
            hs = jnp.stack(hs)
        else:

            def step(hp, zi):
                hn = mu + phi * (hp - mu) + sigma * zi
                return hn, hn

            hs = jnp.concatenate([h0[None], lax.scan(step, h0, z[1:])[1]])
        return lp + jnp.sum(-0.5 * hs - 0.5 * y**2 * jnp.exp(-hs))

    return logp


logp = hier(d) if model == "hier" else sv(d, model == "sv_loop")
x0 = jax.random.uniform(jax.random.key(0), (n, d), jnp.float64, -2.0, 2.0)
# the compiler's one-off start-up costs out of the way first
jax.block_until_ready(jax.jit(lambda a: jnp.sin(a) + 1.0)(x0[0]))
ref = []
for _ in range(int(sys.argv[5])):
    # the gradient's compile time: the median of a few (the caches cleared between)
    jax.clear_caches()
    events.clear()
    jax.block_until_ready(jax.jit(jax.grad(logp))(x0[0]))
    ref.append(max(s for k, _, s in events if k == "compile"))
print(json.dumps(["gradient", float(np.median(ref))]), file=sys.stderr, flush=True)
jax.clear_caches()
events.clear()
t0 = time.perf_counter()
w = cj.langevin_warmup(jax.random.key(1), logp, x0, num_steps=steps)
jax.block_until_ready(w.positions)
wall = time.perf_counter() - t0
progs = defaultdict(lambda: dict(compile=[], lower=[]))
for kind, name, secs in events:
    progs[name][kind].append(secs)
print(json.dumps(dict(
    grad_compile=float(np.median(ref)),
    grad_compiles=ref,
    warmup_wall=wall,
    start=w.info.start,
    programs={k: v for k, v in progs.items() if v["compile"]},
)))
"""


def run_case(model, d, n, steps, timeout, grad_repeats=3):
    """The child's figures; for a child cut off by ``timeout``, those it reported
    (the gradient's compile time and the programs compiled so far), ``timed_out``
    set."""
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                CHILD,
                model,
                str(d),
                str(n),
                str(steps),
                str(grad_repeats),
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        return _partial(err, timeout)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _partial(err: str, timeout: int) -> dict:
    grad, progs = None, {}
    for line in err.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, list):
            continue
        if rec[0] == "gradient":
            grad, progs = rec[1], {}  # the warm-up's events come after this line
        elif grad is not None:
            p = progs.setdefault(rec[1], dict(compile=[], lower=[]))
            p[rec[0]].append(rec[2])
    if grad is None:
        raise RuntimeError(f"timed out after {timeout} s before the gradient compiled")
    return dict(
        grad_compile=grad,
        grad_compiles=[grad],
        warmup_wall=float("nan"),
        start=f"(timed out after {timeout} s)",
        programs={k: v for k, v in progs.items() if v["compile"]},
        # lowered, not compiled: what XLA was compiling when the case was cut off
        pending=[k for k, v in progs.items() if v["lower"] and not v["compile"]],
    )


def main():
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--label", default="", help="tag for the rows")
    parser.add_argument("--append", action="store_true", help="keep earlier rows")
    parser.add_argument(
        "--cases",
        default=None,
        help="comma list of model:d (default: every case of the size switch)",
    )
    parser.add_argument("--particles", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100, help="warm-up num_steps")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds a case")
    parser.add_argument(
        "--grad-repeats",
        type=int,
        default=3,
        help="compilations of the gradient (median); 1 for a model that takes minutes",
    )
    parser.add_argument(
        "--min-seconds",
        type=float,
        default=0.2,
        help="programs compiling faster than this are left out of the markdown",
    )
    args = parser.parse_args()
    if args.cases:
        cases = [(m, int(d)) for m, d in (c.split(":") for c in args.cases.split(","))]
    elif args.quick:
        cases = [("hier", 10), ("hier", 100), ("sv_loop", 30), ("sv_scan", 30)]
    else:
        cases = [("hier", d) for d in (10, 100, 300, 1000)] + [
            ("sv_loop", 100),
            ("sv_scan", 100),
            ("sv_loop", 500),
            ("sv_scan", 500),
        ]
    rows = []
    json_path = Path(args.out_dir) / "compile_scale.json"
    if args.append and json_path.exists():
        rows = json.loads(json_path.read_text())["rows"]
    for model, d in cases:
        try:
            r = run_case(
                model, d, args.particles, args.steps, args.timeout, args.grad_repeats
            )
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"{model} d={d}: failed: {str(e)[-500:]}", flush=True)
            rows.append(dict(label=args.label, model=model, d=d, program="(failed)"))
            continue
        g = r["grad_compile"]
        rows.append(
            dict(
                label=args.label,
                model=model,
                d=d,
                program="jax.jit(jax.grad(logp))",
                compiles=1,
                compile_s=round(g, 3),
                ratio=1.0,
                total_s=round(sum(r["grad_compiles"]), 3),
                warmup_wall_s=round(r["warmup_wall"], 2),
                start=r["start"],
            )
        )
        for name, p in sorted(
            r["programs"].items(), key=lambda kv: -max(kv[1]["compile"])
        ):
            top = max(p["compile"])
            rows.append(
                dict(
                    label=args.label,
                    model=model,
                    d=d,
                    program=name,
                    compiles=len(p["compile"]),
                    compile_s=round(top, 3),
                    total_s=round(sum(p["compile"]), 3),
                    lower_s=round(sum(p["lower"]), 3),
                    ratio=round(top / g, 2),
                )
            )
        for name in r.get("pending", []):
            rows.append(
                dict(
                    label=args.label,
                    model=model,
                    d=d,
                    program=f"{name} (still compiling when cut off)",
                    compiles=0,
                )
            )
        worst = max(
            (
                x
                for x in rows
                if x["model"] == model
                and x["d"] == d
                and x["label"] == args.label
                and x["program"] != "jax.jit(jax.grad(logp))"
            ),
            key=lambda x: x.get("ratio", 0),
        )
        print(
            f"{args.label} {model} d={d}: grad {g:.2f} s; slowest {worst['program']} "
            f"{worst.get('compile_s', float('nan')):.2f} s ({worst.get('ratio')}x); "
            "warm-up wall "
            f"{r['warmup_wall']:.1f} s",
            flush=True,
        )
    md_rows = [
        x
        for x in rows
        if x["program"] in ("jax.jit(jax.grad(logp))", "(failed)")
        or "cut off" in x["program"]
        or x.get("compile_s", 0) >= args.min_seconds
    ]
    write_results(
        "compile_scale",
        dict(particles=args.particles, steps=args.steps),
        rows,
        columns=[
            "label",
            "model",
            "d",
            "program",
            "compiles",
            "compile_s",
            "ratio",
            "total_s",
            "lower_s",
            "warmup_wall_s",
            "start",
        ],
        md_rows=md_rows,
        out_dir=args.out_dir,
        title="Compile time of cj.langevin_warmup's programs (issue 48)",
        notes=[
            "One fresh process per model and d, float64, N = "
            f"{args.particles} particles from Uniform(-2, 2), num_steps = "
            f"{args.steps}. "
            "compile_s: XLA's backend compilation of the program (the slowest, where "
            "it compiled more than once: compiles), from jax.monitoring's "
            "backend-compile events; ratio: compile_s over the gradient's; total_s: "
            "all its compilations; lower_s: jaxpr-to-MLIR time.",
            f"Programs under {args.min_seconds} s are left out here (kept in the "
            "JSON).",
            "Shared 2-core machine: single compile times vary by up to 2x between "
            "runs; the ratios within a process less.",
        ],
    )


if __name__ == "__main__":
    main()
