"""Burn-in and sampling in one compilation (issue 17, item 6), before and after.

Before (``cenlmc_jax/run.py`` at commit :data:`BEFORE`), ``cj.sample`` compiled
one chunk program for the burn-in (its own length, nothing recorded), another for
the sampling chunks and a third for a shorter last chunk or the replay up to a
diverging step: each traced and compiled the whole step, model and gradient
switch included. After, one program of ``chunk_size`` steps serves them all: a
traced step count skips the steps past it (a ``lax.cond``) and a traced flag says
whether to record (``run._chunk_fn``).

Each measurement runs in a fresh Python process (so that it compiles), the
variants alternating, ``--repeats`` rounds. Per run: the wall time of the first
``sample`` call (compilation included), the XLA compilations it made and their
total time (``jax.monitoring``'s backend-compile events), and the wall time of a
second identical call in the same process (compiled: the step's run time, where
the ``lax.cond`` per step would show). Both variants give the same draws (checked:
the final positions agree exactly).

Cases: SIR (d = 2, RK4 in ``lax.scan``), CEnLMC with N = 2,000, 100 burn-in + 300
steps (``--quick``: N = 200, 20 + 60); a standard Gaussian, LMC with N = 2,000,
d = 2, 500 burn-in + 1,000 steps (a cheap step: the cond's overhead at its
largest relative to the step).

``python benchmarks/bench_one_compile.py`` (needs the git history for the
"before" driver). Writes benchmarks/results/one_compile.{json,md}.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import base_parser, write_results  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BEFORE = "d27bc7a"  # the last commit with a burn-in program of its own

CHILD = r"""
import importlib.util, json, sys, time
import jax, numpy as np
import cenlmc_jax as cj
compiles = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, secs, **kw: compiles.append(secs)
    if event == "/jax/core/compile/backend_compile_duration"
    else None)
variant, case, quick, before_path = (
    sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4])
if variant == "before":
    spec = importlib.util.spec_from_file_location("run_before", before_path)
    driver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(driver)
else:
    from cenlmc_jax import run as driver
if case == "sir":
    n, burn, steps = (200, 20, 60) if quick else (2000, 100, 300)
    tgt = cj.models.inverse_problems.sir_epidemic().as_target()
    s = cj.ensemble.tuning.suggest_cenlmc_params(2, 0.05, num_particles=n)
    algo = cj.cenlmc(tgt.logdensity_fn, 0.05, s.eta, s.r1, s.r2, s.n_star, s.m_f)
else:
    n, burn, steps = (200, 50, 100) if quick else (2000, 500, 1000)
    tgt = cj.models.targets.standard_gaussian(2)
    algo = cj.lmc(tgt.logdensity_fn, 0.05)
if getattr(tgt, "sample", None):
    x0 = tgt.sample(jax.random.key(0), n)
else:
    x0 = 0.5 * jax.random.normal(jax.random.key(0), (n, 2))
state = algo.init(x0)
def go():
    t = time.perf_counter()
    res = driver.sample(jax.random.key(1), algo, state, steps, burn_in=burn,
                        check_convergence=False, on_divergence="warn")
    jax.block_until_ready(res.state.position)
    return time.perf_counter() - t, res
jax.block_until_ready(state)
mark = len(compiles)
first, res = go()
n_comp, comp_s = len(compiles) - mark, sum(compiles[mark:])
second, res2 = go()
print(json.dumps(dict(
    first_s=first, second_s=second, compiles=n_comp, compile_s=comp_s,
    position=np.asarray(res.state.position, np.float64).ravel()[:64].tolist(),
    same_twice=bool(np.array_equal(np.asarray(res.state.position),
                                   np.asarray(res2.state.position))))))
"""


def main():
    parser = base_parser(" ".join(__doc__.split("\n\n")[0].split()))
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    before = subprocess.run(
        ["git", "show", f"{BEFORE}:cenlmc_jax/run.py"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rows, raw = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        before_path = os.path.join(tmp, "run_before.py")
        Path(before_path).write_text(before)
        for case in ("sir", "gaussian"):
            for r in range(repeats):
                for variant in (
                    ("before", "after") if r % 2 == 0 else ("after", "before")
                ):
                    out = subprocess.run(
                        [
                            sys.executable,
                            "-c",
                            CHILD,
                            variant,
                            case,
                            "1" if args.quick else "0",
                            before_path,
                        ],
                        cwd=REPO,
                        check=False,
                        capture_output=True,
                        text=True,
                    )
                    if out.returncode:
                        raise SystemExit(
                            f"{case} {variant} failed:\n{out.stderr[-3000:]}"
                        )
                    rec = json.loads(out.stdout.strip().splitlines()[-1])
                    raw.setdefault((case, variant), []).append(rec)
                    print(
                        case,
                        variant,
                        {k: v for k, v in rec.items() if k != "position"},
                        flush=True,
                    )
    for case in ("sir", "gaussian"):
        b, a = raw[(case, "before")], raw[(case, "after")]
        same = all(x["position"] == b[0]["position"] for x in a + b)
        med = {
            v: {
                k: statistics.median(x[k] for x in raw[(case, v)])
                for k in ("first_s", "second_s", "compile_s")
            }
            for v in ("before", "after")
        }
        for v, recs in (("before", b), ("after", a)):
            rows.append(
                dict(
                    case=case,
                    variant=v,
                    compiles=recs[0]["compiles"],
                    first_s=round(med[v]["first_s"], 2),
                    compile_s=round(med[v]["compile_s"], 2),
                    second_s=round(med[v]["second_s"], 3),
                    firsts=[round(x["first_s"], 2) for x in recs],
                    seconds=[round(x["second_s"], 3) for x in recs],
                    same_draws=same,
                )
            )
        rows.append(
            dict(
                case=case,
                variant="before / after",
                compiles="-",
                first_s=round(med["before"]["first_s"] / med["after"]["first_s"], 2),
                compile_s=round(
                    med["before"]["compile_s"] / med["after"]["compile_s"], 2
                ),
                second_s=round(med["before"]["second_s"] / med["after"]["second_s"], 2),
                firsts="-",
                seconds="-",
                same_draws=same,
            )
        )
    notes = [
        f"{repeats} rounds per case, each variant in a fresh process, the order "
        "alternating; medians.",
        "compiles: XLA compilations during the first sample call; compile_s: their "
        "total time; first_s: the first call's wall time (compilation included); "
        "second_s: the same call again (compiled).",
        "same_draws: the final positions (first 64 values) of every run, both "
        "variants, are equal.",
        "Shared 2-core machine: other sessions may have run at the same time; read the "
        "ratios.",
    ]
    write_results(
        "one_compile",
        dict(quick=args.quick, repeats=repeats, before=BEFORE),
        rows,
        columns=[
            "case",
            "variant",
            "compiles",
            "first_s",
            "compile_s",
            "second_s",
            "firsts",
            "seconds",
            "same_draws",
        ],
        out_dir=args.out_dir,
        notes=notes,
        title="Burn-in and sampling in one compilation: before and after (issue 17, "
        "item 6)",
    )


if __name__ == "__main__":
    main()
