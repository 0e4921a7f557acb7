"""No wasted work (issue 30): each item measured before and after, in one run.

* import: wall time of ``python -c "import cenlmc_jax"`` in a fresh process (and
  of ``import jax``, the floor when the package imports JAX).
* summary: in a fresh process with JAX imported, ``import cenlmc_jax`` and the first
  ``cj.summary`` of 4 chains x 1,000 draws x 2 (the imports it makes included).
* lmc/sgld: process CPU time of 100 steps of ``cj.lmc`` (an ensemble of 1,000)
  over ``blackjax.sgld`` (1,000 chains vmapped), full gradient, same step size,
  interleaved pairs; logistic regression (d = 25, 1,000 rows) and a Gaussian.
* cenlmc/lmc at fraction 0: one ``cenlmc_step`` (d = 10, R1 below the noise's
  reach: no particle passes the R1 test) over one ``lmc_step``, same N; the two
  calls interleaved, the median of the ratios of each repeat's pair.
* cenlmc scaling: one ``cenlmc_step`` at d = 2 with
  ``suggest_cenlmc_params(2, h, num_particles=N)``, the sizes interleaved (an
  untimed and a timed step of each per round, medians); the exponent of N fitted
  between consecutive sizes and between the first and last.
* cli: user + sys CPU time of ``cenlmc-jax sample`` (the default job) with an
  empty compilation cache (cold), then again (warm).

"before" is the code of ``--before`` (a commit, checked out with ``git worktree``
into a temporary folder), "after" this tree; every measurement runs in a subprocess
on one tree (the editable install's finder taken out of ``sys.meta_path`` so the
tree given is the one imported).

``python benchmarks/bench_waste.py [--before COMMIT] [--quick] [--skip-cli]
[--only-d]``; ``--only-d`` reruns the (d) rows and keeps the other rows' figures
from the results file.
Writes benchmarks/results/waste.{json,md}.
"""

from __future__ import annotations

import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parents[1]

#: Run first in every subprocess: the tree on PYTHONPATH, not the editable install.
PRELUDE = (
    "import sys; sys.meta_path[:] = [f for f in sys.meta_path "
    "if 'Editable' not in getattr(f, '__name__', type(f).__name__)]; "
)


# ------------------------------------------------------------------ the workers


def w_summary(_args):
    import jax
    import jax.numpy as jnp
    import numpy as np

    jnp.zeros(1).block_until_ready()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 1000, 2)).cumsum(1) * 0.1 + rng.normal(size=(4, 1000, 2))
    t0 = time.perf_counter()
    import cenlmc_jax as cj

    cj.summary(x)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    cj.summary(x + 1.0)
    return {
        "first_s": first,
        "second_s": time.perf_counter() - t0,
        "jax": jax.__version__,
    }


def _logistic(d=25, rows=1000, seed=0):
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(rows, d)) / np.sqrt(d)
    w = rng.normal(size=d)
    y = rng.random(rows) < 1 / (1 + np.exp(-(X @ w)))
    X, y = jnp.asarray(X, jnp.float32), jnp.asarray(y, jnp.float32)

    def logp(x):
        z = X @ x
        return jnp.sum(y * z - jnp.logaddexp(0.0, z)) - 0.5 * jnp.sum(x**2)

    return logp


def w_lmc_sgld(args):
    import blackjax
    import jax
    import jax.numpy as jnp
    from jax import lax

    import cenlmc_jax as cj

    n, steps, d = args["chains"], args["steps"], 25

    def runners(logp, h):
        algo = cj.lmc(logp, h)
        grad = jax.grad(logp)
        sgld = blackjax.sgld(lambda x, batch: grad(x))
        vstep = jax.vmap(lambda k, x: sgld.step(k, x, None, h))

        def scan(step):
            def body(s, key):
                return step(key, s), None

            return jax.jit(
                lambda key, s: lax.scan(body, s, jax.random.split(key, steps))[0]
            )

        run_a = scan(lambda key, s: algo.step(key, s)[0])
        run_b = scan(lambda key, x: vstep(jax.random.split(key, n), x))
        return (run_a, algo.init(jnp.zeros((n, d)))), (run_b, jnp.zeros((n, d)))

    out = {}
    for name, logp, h in (
        ("logistic", _logistic(), 1e-3),
        ("gaussian", lambda x: -0.5 * jnp.sum(x**2), 0.1),
    ):
        (ra, sa), (rb, sb) = runners(logp, h)
        key = jax.random.key(0)
        jax.block_until_ready(ra(key, sa))
        jax.block_until_ready(rb(key, sb))
        ratios = []
        # one pair's ratio spreads by +-25% on the shared 2-core machine: the median of
        # 21 pairs or more is steady to a few percent
        for r in range(max(args["repeats"], 21)):
            t = {}
            pair = (("a", ra, sa), ("b", rb, sb))
            for label, fn, s in pair if r % 2 == 0 else pair[::-1]:
                c0 = time.process_time()
                jax.block_until_ready(fn(key, s))
                t[label] = time.process_time() - c0
            ratios.append(t["a"] / t["b"])
        out[name] = {
            "ratio": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
        }
    return out


def _interleaved(fns: dict, repeats: int, warm: int = 0) -> dict:
    """Process CPU times of calls of each ``fns[name] = (fn, state)``.

    The calls interleaved, one round of all per repeat (the load of the shared
    machine then falls on all alike), after one untimed call each; ``warm``
    untimed calls before each timed one (a small step timed right after a large
    one otherwise pays for the caches the large one emptied).
    """
    import jax

    key = jax.random.key(1)
    for fn, state in fns.values():
        jax.block_until_ready(fn(key, state))
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, (fn, state) in fns.items():
            for _ in range(warm):
                jax.block_until_ready(fn(key, state))
            c0 = time.process_time()
            jax.block_until_ready(fn(key, state))
            times[name].append(time.process_time() - c0)
    return times


def w_fraction0(args):
    import functools

    import jax

    import cenlmc_jax as cj

    d, h, out = 10, 0.05, {}
    tgt = cj.models.targets.standard_gaussian(d)
    for n in args["sizes"]:
        x = tgt.sample(jax.random.key(0), n)
        cst = cj.ensemble.cenlmc_init(x, tgt.logdensity_fn, tgt.f_star)
        lst = cj.ensemble.lmc_init(x, tgt.logdensity_fn)
        ckern = jax.jit(
            functools.partial(
                cj.ensemble.cenlmc_step,
                logdensity_fn=tgt.logdensity_fn,
                step_size=h,
                eta=0.5,
                r1=0.01,  # sqrt(2hd) = 1: no particle passes R1
                r2=0.7,
                n_star=5,
                m_f=20.0,
            )
        )
        lkern = jax.jit(
            functools.partial(
                cj.ensemble.lmc_step, logdensity_fn=tgt.logdensity_fn, step_size=h
            )
        )
        cst, info = ckern(jax.random.key(2), cst)  # past step 0 (w = +inf)
        t = _interleaved({"c": (ckern, cst), "l": (lkern, lst)}, args["repeats"])
        _, info = ckern(jax.random.key(3), cst)
        out[str(n)] = {
            "cenlmc_ms": 1e3 * statistics.median(t["c"]),
            "lmc_ms": 1e3 * statistics.median(t["l"]),
            # each repeat's pair of calls ran back to back: the median of their ratios
            "ratio": statistics.median(
                a / b for a, b in zip(t["c"], t["l"], strict=True)
            ),
            "fraction": float(info.ensemble_fraction),
        }
    return out


def w_scaling(args):
    import functools

    import jax

    import cenlmc_jax as cj

    d, h, out, fns = 2, 0.05, {}, {}
    tgt = cj.models.targets.standard_gaussian(d)
    for n in args["sizes"]:
        prm = cj.ensemble.tuning.suggest_cenlmc_params(d, h, num_particles=n)
        x = tgt.sample(jax.random.key(0), n)
        st = cj.ensemble.cenlmc_init(x, tgt.logdensity_fn, tgt.f_star)
        kern = jax.jit(
            functools.partial(
                cj.ensemble.cenlmc_step,
                logdensity_fn=tgt.logdensity_fn,
                step_size=h,
                eta=prm.eta,
                r1=prm.r1,
                r2=prm.r2,
                n_star=prm.n_star,
                m_f=prm.m_f,
            )
        )
        for k in range(3):  # into the stationary regime of the tests
            st, info = kern(jax.random.key(10 + k), st)
        fns[str(n)] = (kern, st)
        out[str(n)] = {
            "eta": prm.eta,
            "r2": prm.r2,
            "n_star": prm.n_star,
            "mean_num_neighbours": float(info.mean_num_neighbours),
            "fraction": float(info.ensemble_fraction),
        }
    # the sizes interleaved, so that the exponents compare steps timed under one load
    times = _interleaved(fns, args["repeats"], warm=1)
    for n, t in times.items():
        out[n]["ms"] = 1e3 * statistics.median(t)
    return out


WORKERS = {"summary": w_summary, "lmc_sgld": w_lmc_sgld, "fraction0": w_fraction0}
WORKERS["scaling"] = w_scaling


# ------------------------------------------------------------------ the driver


def worker_call(tree: Path, name: str, args: dict) -> dict:
    """``WORKERS[name](args)`` in a fresh process importing ``tree``."""
    code = (
        PRELUDE + f"sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); "
        "import json, bench_waste as b; "
        f"out = b.WORKERS[{name!r}](json.loads({json.dumps(args)!r})); "
        "print('RESULT ' + json.dumps(out))"
    )
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        cwd=tree,  # `python -c` puts the working folder first on sys.path
    )
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{name} on {tree} failed:\n{out.stderr[-3000:]}")


def child_cpu(cmd: list, env: dict) -> tuple:
    """(user + sys CPU s, wall s) of a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    # in the tree's folder: `python -c` puts the working folder first on sys.path
    subprocess.run(cmd, env=env, check=True, capture_output=True, cwd=env["PYTHONPATH"])
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def import_times(tree: Path, repeats: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = {}
    for label, stmt in (("cenlmc_jax", "import cenlmc_jax"), ("jax", "import jax")):
        walls = [
            child_cpu([sys.executable, "-c", PRELUDE + stmt], env)[1]
            for _ in range(repeats)
        ]
        out[label] = {"median_s": statistics.median(walls), "min_s": min(walls)}
    return out


#: One job in-process, counting the programs it lowers (each traced, lowered and then
#: compiled or loaded from the cache: a fixed cost of a warm job).
PROGRAMS = (
    "import jax.monitoring as m; n = []; "
    "m.register_event_duration_secs_listener(lambda e, d, **k: n.append(e) "
    "if e.endswith('jaxpr_to_mlir_module_duration') else None); "
    "from cenlmc_jax.cli import main; import tempfile; "
    "main(['sample', '--compile-cache', tempfile.mkdtemp()]); "
    "print('PROGRAMS', len(n))"
)


def cli_programs(env: dict) -> int:
    """The programs ``cenlmc-jax sample`` lowers, in a fresh process with ``env``."""
    out = subprocess.run(
        [sys.executable, "-c", PRELUDE + PROGRAMS],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        cwd=env["PYTHONPATH"],
    )
    return int(next(x for x in out.stdout.splitlines() if x.startswith("PROGRAMS"))[9:])


def cli_times(trees: dict, repeats: int) -> dict:
    """``cenlmc-jax sample`` (the README's main job) on each tree: user + sys CPU s with
    an empty compilation cache (cold), then again with the cache it wrote (warm).

    ``repeats`` rounds, each running every tree once cold and once warm (the trees
    interleaved, so that the shared machine's load falls on all alike); the medians,
    and every figure.

    Each tree's modules are compiled to bytecode first (``compileall``, into the
    tree's own ``__pycache__`` folders), as ``pip install`` does: a user's job does not
    compile the library's sources, and with ``PYTHONDONTWRITEBYTECODE`` set (as on
    these machines) every timed run would (about 0.2-0.3 s of the job). Not by
    ``PYTHONPYCACHEPREFIX``: that moves every module's bytecode, JAX's and NumPy's
    too, so each timed run compiled them all again (about 1.6 s of ``import jax``;
    the (e) rows from commit 5294de9 to 8540fb0 carry it).
    """
    runs = {label: {"cold": [], "warm": [], "warm_wall": []} for label in trees}
    envs = {}
    for label, tree in trees.items():
        env = dict(os.environ, PYTHONPATH=str(tree))
        for key in (
            "CENLMC_JAX_CACHE_DIR",
            "CENLMC_JAX_NO_CACHE",
            "PJRT_NPROC",
            "PYTHONPYCACHEPREFIX",
        ):
            env.pop(key, None)
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", str(Path(tree) / "cenlmc_jax")],
            env=env,
            check=True,
            capture_output=True,
        )
        envs[label] = env
    programs = {label: cli_programs(env) for label, env in envs.items()}
    for _ in range(repeats):
        for label in trees:
            env = envs[label]
            with tempfile.TemporaryDirectory() as cache:
                cmd = [
                    sys.executable,
                    "-c",
                    PRELUDE + "from cenlmc_jax.cli import main; sys.exit(main())",
                    "sample",
                    "--compile-cache",
                    cache,
                ]
                cold = child_cpu(cmd, env)
                warm = child_cpu(cmd, env)
            runs[label]["cold"].append(cold[0])
            runs[label]["warm"].append(warm[0])
            runs[label]["warm_wall"].append(warm[1])
    return {
        label: {
            "programs": programs[label],
            "repeats": repeats,
            "cold_cpu_s": statistics.median(r["cold"]),
            "warm_cpu_s": statistics.median(r["warm"]),
            "warm_wall_s": statistics.median(r["warm_wall"]),
            "all": r,
        }
        for label, r in runs.items()
    }


def exponents(sizes: list, ms: list) -> list:
    return [
        math.log(ms[i + 1] / ms[i]) / math.log(sizes[i + 1] / sizes[i])
        for i in range(len(sizes) - 1)
    ]


def main():
    from _common import base_parser, write_results

    parser = base_parser(" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--before", default="5c7e7ee", help="the commit before")
    parser.add_argument("--skip-cli", action="store_true")
    parser.add_argument(
        "--cli-repeats", type=int, default=3, help="cold + warm CLI runs per tree"
    )
    parser.add_argument("--chains", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--fraction0-sizes", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument(
        "--scaling-sizes",
        type=int,
        nargs="+",
        default=[8192, 32768, 131072, 262144, 524288, 1048576],
    )
    parser.add_argument(
        "--only-d",
        action="store_true",
        help="rerun the (d) rows only; the other rows keep the figures of the "
        "results file (its raw entries)",
    )
    parser.add_argument(
        "--only-ce",
        action="store_true",
        help="rerun the (c) and (e) rows only; the other rows keep the figures of the "
        "results file (its raw entries)",
    )
    parser.add_argument(
        "--only-e", action="store_true", help="as --only-ce, the (e) rows only"
    )
    parser.add_argument(
        "--cli-before",
        default="ed76823",
        help="the commit before of the (e) rows: the CLI job before this round's work "
        "on it (the step-halving check on; --before's job had none)",
    )
    parser.add_argument(
        "--scaling-before-max",
        type=int,
        default=32768,
        help="largest N of the scaling run on the before code (N^1.7 there)",
    )
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.chains, args.steps = 3, 200, 30
        args.fraction0_sizes, args.scaling_sizes = [2048], [4096, 16384]
        args.scaling_before_max, args.skip_cli = 16384, True

    before = Path(tempfile.mkdtemp(prefix="cenlmc_before_"))
    subprocess.run(
        [
            "git",
            "-C",
            str(ROOT),
            "worktree",
            "add",
            "-f",
            "--detach",
            str(before),
            args.before,
        ],
        check=True,
        capture_output=True,
    )
    trees = {"before": before, "after": ROOT}
    rows, raw = [], {}
    kept, keep = None, ()
    if args.only_d or args.only_ce or args.only_e:
        kept = json.loads((Path(args.out_dir) / "waste.json").read_text())
        keep = (
            ("import", "summary", "lmc_sgld", "cli")
            if args.only_d
            else ("import", "summary", "fraction0", "scaling")
            + (("lmc_sgld",) if args.only_e else ())
        )
    try:
        for label, tree in trees.items():
            print(label, "...", flush=True)
            r = raw[label] = {}
            for key in keep:
                if key in kept["raw"][label]:
                    r[key] = kept["raw"][label][key]
            if "import" not in keep:
                r["import"] = import_times(tree, args.repeats)
                r["summary"] = worker_call(tree, "summary", {})
            if "lmc_sgld" not in keep:
                r["lmc_sgld"] = worker_call(
                    tree,
                    "lmc_sgld",
                    {
                        "chains": args.chains,
                        "steps": args.steps,
                        "repeats": args.repeats,
                    },
                )
            if "fraction0" not in keep:
                r["fraction0"] = worker_call(
                    tree,
                    "fraction0",
                    {"sizes": args.fraction0_sizes, "repeats": args.repeats},
                )
                sizes = [
                    n
                    for n in args.scaling_sizes
                    if label == "after" or n <= args.scaling_before_max
                ]
                r["scaling"] = worker_call(
                    tree, "scaling", {"sizes": sizes, "repeats": args.repeats}
                )
            print(json.dumps(r), flush=True)
        if not args.skip_cli and "cli" not in keep:
            print("cli ...", flush=True)
            # the committed trees (the working tree may hold others' unfinished edits)
            commits = {"before": args.cli_before, "after": "HEAD"}
            cli_trees = {}
            for label, commit in commits.items():
                cli_trees[label] = Path(tempfile.mkdtemp(prefix="cenlmc_cli_"))
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "add", "-f", "--detach"]
                    + [str(cli_trees[label]), commit],
                    check=True,
                    capture_output=True,
                )
                commits[label] = subprocess.run(
                    ["git", "-C", str(cli_trees[label]), "rev-parse", "--short", "HEAD"]
                    + [],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout.strip()
            try:
                for label, times in cli_times(cli_trees, args.cli_repeats).items():
                    raw[label]["cli"] = dict(times, commit=commits[label])
            finally:
                for tree in cli_trees.values():
                    subprocess.run(
                        ["git", "-C", str(ROOT), "worktree", "remove", "--force"]
                        + [str(tree)],
                        capture_output=True,
                    )
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before)],
            capture_output=True,
        )

    def row(item, what, b, a, target=""):
        rows.append(
            {"item": item, "measure": what, "before": b, "after": a, "target": target}
        )

    b, a = raw["before"], raw["after"]
    row(
        "(a)",
        "`import cenlmc_jax`, wall s (median)",
        b["import"]["cenlmc_jax"]["median_s"],
        a["import"]["cenlmc_jax"]["median_s"],
        "<= 1 s",
    )
    row(
        "(a)",
        "`import jax` alone, wall s",
        b["import"]["jax"]["median_s"],
        a["import"]["jax"]["median_s"],
    )
    row(
        "(b)",
        "import + first `cj.summary` (JAX imported), s",
        b["summary"]["first_s"],
        a["summary"]["first_s"],
        "<= 1 s",
    )
    row(
        "(b)",
        "second `cj.summary`, s",
        b["summary"]["second_s"],
        a["summary"]["second_s"],
    )
    for name in ("logistic", "gaussian"):
        row(
            "(c)",
            f"cj.lmc / blackjax.sgld CPU time, {name} (median of pairs)",
            b["lmc_sgld"][name]["ratio"],
            a["lmc_sgld"][name]["ratio"],
            "<= 1.02",
        )
    for n in args.fraction0_sizes:
        row(
            "(d)",
            f"cenlmc_step / lmc_step at fraction 0, d = 10, N = {n}",
            b["fraction0"][str(n)]["ratio"],
            a["fraction0"][str(n)]["ratio"],
            "<= 1.1",
        )
        row(
            "(d)",
            f"cenlmc_step ms at fraction 0, d = 10, N = {n}",
            b["fraction0"][str(n)]["cenlmc_ms"],
            a["fraction0"][str(n)]["cenlmc_ms"],
        )
    for n in args.scaling_sizes:
        row(
            "(d)",
            f"cenlmc_step ms, d = 2, suggested params, N = {n}",
            b["scaling"].get(str(n), {}).get("ms", "-"),
            a["scaling"][str(n)]["ms"],
        )
    for label in ("before", "after"):
        sizes = [int(k) for k in raw[label]["scaling"]]
        ms = [raw[label]["scaling"][str(k)]["ms"] for k in sizes]
        raw[label]["scaling_exponents"] = exponents(sizes, ms)
    row(
        "(d)",
        "cenlmc_step growth exponent of N, d = 2 (between consecutive sizes)",
        ", ".join(f"{e:.2f}" for e in raw["before"]["scaling_exponents"]),
        ", ".join(f"{e:.2f}" for e in raw["after"]["scaling_exponents"]),
        "<= 1.15",
    )
    sizes = [int(k) for k in raw["after"]["scaling"]]
    first, last = str(min(sizes)), str(max(sizes))
    row(
        "(d)",
        f"cenlmc_step growth exponent of N, d = 2, N = {first} to {last}",
        "-",
        exponents(
            [int(first), int(last)],
            [raw["after"]["scaling"][k]["ms"] for k in (first, last)],
        )[0],
        "<= 1.15",
    )
    if "cli" in b and "cli" in a:
        k = a["cli"].get("repeats", 3)
        for key, what in (
            ("cold_cpu_s", f"`cenlmc-jax sample` CPU s, empty cache (median of {k})"),
            ("warm_cpu_s", f"`cenlmc-jax sample` CPU s, warm cache (median of {k})"),
        ):
            row("(e)", what, b["cli"][key], a["cli"][key], "<= 8 s warm")
        if "programs" in a["cli"]:
            row(
                "(e)",
                "programs the job lowers (and compiles or loads)",
                b["cli"].get("programs", "-"),
                a["cli"]["programs"],
            )
    kept_note = (
        []
        if kept is None
        else [
            "Rows (a)-(c) (and (e)) are the figures of the run of "
            f"{kept['machine']['date_utc']} (`{kept['command']}`), kept by `--only-d`; "
            "the (d) rows are this run's."
        ]
        if args.only_d
        else [
            "Rows (a), (b) and (d) are the figures of the run of "
            f"{kept['machine']['date_utc']} (`{kept['command']}`), kept by "
            "`--only-ce`; the (c) and (e) rows are this run's."
        ]
        if args.only_ce
        else [
            "Rows (a)-(d) are kept from the results file by `--only-e` ((d): the run "
            f"of {kept['machine']['date_utc']}, `{kept['command']}`); the (e) rows "
            "are this run's."
        ]
    )
    write_results(
        "waste",
        {"before_commit": args.before, "raw": raw},
        rows,
        columns=["item", "measure", "before", "after", "target"],
        out_dir=args.out_dir,
        title="No wasted work (issue 30): before and after",
        notes=[
            "Each figure from a fresh process on the tree named (before: "
            f"`{args.before}`), on a 2-core machine shared with other jobs: CPU-time "
            "ratios of interleaved pairs are the steady figures, wall times are noisy.",
            "(c): the same step size and number of chains for both; cj.lmc no longer "
            "evaluates the log density (track_logdensity=False, the default).",
            "(d) fraction 0: R1 = 0.01 below the noise's reach sqrt(2hd) = 1, so no "
            "particle passes the R1 test; the pair sums are then skipped (lax.cond).",
            "(d) scaling: suggest_cenlmc_params(2, 0.05, num_particles=N) now caps the "
            "typical neighbour count (max_neighbours=256): R2 and eta shrink like "
            "N^(-1/2) beyond N ~ 10^4. The before code is run up to "
            f"N = {args.scaling_before_max} only (it grows like N^1.7). The sizes "
            "are timed interleaved in one process (per round one untimed and one timed "
            "step of each), so that the exponents compare steps under the same load.",
            "(d) what changed (after): at fraction 0 the step takes one vmapped "
            "gradient over all particles when all need one (no compaction into "
            "buffers, no audit draw), and draws its noise once (XLA had fused the "
            "threefry draw into both of its consumers, x' and log p', computing it "
            "twice). In the scaling, the block-sparse plan (which tile pairs to "
            "visit) tested every pair of tile boxes, (N/64)(N/32) tests: O(N^2), "
            "0.23 s of the 0.73 s step at N = 131072; it now tests row tiles "
            "against super tiles of 64 column tiles first (pairwise/tiled.py, "
            "sparse_plan), O(N) up to N ~ 2^20 for the bounded neighbour counts, "
            "and lists the same tile pairs in the same order (the same sums).",
            "(d) the exponents between consecutive sizes scatter by about 0.15 from "
            "run to run on this shared machine (two runs, the first before the "
            "plan's second level was sized for small N: 0.77-1.13 and 0.93-1.22); "
            "the exponent from the first size to the last is the steadier figure "
            "(0.98 and 1.02).",
            "(c) (rerun with --only-ce, 2026-12-03 12:36 UTC, 21 interleaved pairs "
            "or more: one pair's ratio spreads by +-25% here): within the target, "
            "and no per-step difference left to remove. In the bench's scan the info "
            "is dropped (XLA removes the divergence count); cj.lmc's step is then "
            "SGLD's arithmetic plus one (N, d) array carried in the state, the "
            "gradient at x' kept for the next step's drift (so an expensive gradient "
            "is taken once a step). A hand-written ULA carrying its gradient ran at "
            "1.016x SGLD in the run where cj.lmc ran at 1.026x. Under cj.sample the "
            "divergence count (positions and gradients finite) costs ~5% of a "
            "Gaussian step; one-pass forms of it measured no faster.",
            "(e) before: the CLI of `--cli-before` (step-halving check on; the job of "
            "`--before` had no such check: 22.8 s cold, 17.1 s warm in the run of "
            "12:41 UTC); after: HEAD at the run, both as committed, interleaved. "
            "What changed: the check's h/2 run reuses the run's compiled chunk (the "
            "step size carried in the state, cli.samplers.step_size_traced), and "
            "scipy.stats is no longer imported (0.6 s): ~2 s of a warm job and ~7 s of "
            "a cold one in single-process timings. Then (f65a1c6) the block-sparse "
            "pair force, which halves this job's CEnLMC step, holds no host callback "
            "(its fallback flags are returned, info.dense_fallback), so JAX's "
            "persistent cache keeps its program, and method='auto' takes it at d <= 2 "
            "from N = 1,792 (was 2,048), this job's N = 2,000 included. Round of "
            "20e476e -> afea791: the spatial sort packs key and index into one int32 "
            "(a one-operand sort) and below 4,096 particles the block-sparse tiles "
            "are 32 rows (bench_sparse_tiles.md): 0.82x the warm job's CPU. Latest "
            "round (before = afea791): --cpu-threads auto gives XLA's CPU pool one "
            "thread at N d <= 16,384 (this job: 4,000), where a pool of a thread a "
            "core spent ~1.8x the CPU on the same steps (bench_cpu_threads.md); the "
            "CLI imports neither cenlmc_jax.adaptation nor the inverse-problem, "
            "posteriordb and LDA models; and the run's small host-side computations "
            "(the starting noise, the online diagnostics' set-up and finish, slicing "
            "and joining the chunks' infos) are one compiled program each instead of "
            "one per operation: 76 -> 35 programs loaded from the cache (each ~15 ms "
            "of lowering and loading). Then (265c12c) the third-party modules the job "
            "does not use are imported where they are used: Pallas and its Triton "
            "module, optax (the f* search), scipy.fft and scipy.special (a traced "
            "run's summary): 0.49 -> 0.15 s of imports beyond jax's. Latest round "
            "(before = 15fa241, programs counted in-process): the samplers' init "
            "builds its constant fields in one program, the log density's example "
            "is checked abstractly (no eager slice), host-side results (the moments' "
            "variance, the kept infos, the verdict's slices) are NumPy, and the "
            "online diagnostics' split is inside their program: 43 -> 19 programs. "
            "Both trees' modules are compiled to bytecode before timing, as pip "
            "install does (these machines set PYTHONDONTWRITEBYTECODE, so earlier "
            "rounds compiled the library's sources in every timed run, ~0.2 s). "
            "Latest round (before = 92883d8): the pair kernel counts both masks in "
            "one int32 sum, which XLA:CPU fuses with the pass that makes them (a "
            "float sum went to a library reduction that first wrote each (B, C) mask "
            "out), and the block-sparse fold pads the force operand to 8 columns "
            "(the library dot is ~1/4 faster so): the job's CEnLMC step 2.08 -> 1.47 "
            "ms in one single-process run (1.25 ms in a quiet minute), the same "
            "draws. Then ml_dtypes 0.7.0 was excluded (bench_ml_dtypes.md: 1.1 s of "
            "every import jax; both trees of later rounds run on 0.6.0). Latest "
            "round (before = 8540fb0): the command ends by os._exit once its output "
            "is flushed, skipping Python's shutdown (JAX's atexit clearing and the "
            "freeing of every module, ~0.35 s; not with a --model, whose own code "
            "may need it). What is left of a warm job (JAX_LOG_COMPILES=1, a quiet "
            "host, 2026-12-04 22:30 UTC): importing the CLI 0.6 s, the small "
            "programs before the run 0.3 s, the run's program traced 0.35-0.43 s, "
            "lowered 0.26 s and loaded from the cache 0.25-0.31 s, and 3.2 s of "
            "steps (2,476 CEnLMC steps; the step-halving check 1,276 of them). "
            "bench_cli_cpu.md times the job round by round beside the host's speed. "
            "From 5294de9 to 8540fb0 this benchmark set PYTHONPYCACHEPREFIX for the "
            "trees' bytecode, which moved JAX's and NumPy's too: every timed run "
            "compiled them again (~1.6 s more on both sides of the (e) rows of those "
            "rounds); each tree is now compiled in place.",
            *kept_note,
        ],
    )


if __name__ == "__main__":
    main()
