"""cenlmc_jax against BlackJAX (1.7.1), in one process: per-step time, draws,
acceptance.

Every comparison runs ``--chains`` chains vmapped (``d = 10``), ``--steps``
steps per jitted ``lax.scan`` call, both samplers from the same keys and
states. Timing is interleaved (cenlmc_jax, BlackJAX, BlackJAX, cenlmc_jax, ...)
and the figure is the median over ``--repeats`` pairs of the per-pair ratio
``t_cenlmc / t_blackjax`` (the machine is shared: ratios taken side by side
are what holds). The equality checks say how far the two samplers' draws
agree: the fraction of chain-steps with the same accept decision, the largest
difference of the final positions, and the acceptance rates.

Rows (the table of issue 10):
  rwmh        ``cj.rwmh`` vs ``blackjax.normal_random_walk(sigma=step)``
  lmc/sgld    ``cj.lmc`` (an ensemble of ``chains`` particles) vs ``blackjax.sgld``
              with the full gradient (keys differ by design: compared by the
              stationary variance against ULA's exact ``1/(1 - h/2)``)
  sgrhmc      ``sgrhmc_step`` with ``inv_metric_fn = 1`` vs BlackJAX's SGHMC diffusion
              (``alpha = 1``) with the full gradient
  mala        ``irreversible_mh(sde_proposal(1, 0, ...))`` vs ``blackjax.mala``,
              three step sizes, on a Gaussian and on
              ``cj.models.targets.logistic_regression(dim=10)``
  sghmc       ``cj.sghmc`` with ``minibatch_grad_estimator`` vs BlackJAX's SGHMC
              diffusion with ``blackjax.sgmcmc.gradients.grad_estimator`` on the
              same minibatch (same indices from the same key: with replacement, and
              Floyd's subsets)
Then the minibatch draw alone (``replace=True``, Floyd, and the former
``jax.random.choice(replace=False)``), and the Q-sweep: ``sde_proposal`` with
``Q = c·J`` (whitened) against MALA (``c = 0``), each tuned to acceptance
0.574 by ``cj.adaptation``, on the banana, a correlated Gaussian and the
logistic regression: ESS per gradient evaluation.

Run: ``pip install blackjax==1.7.1`` (the ``bench`` extra), then
``python benchmarks/bench_peers.py`` (``--quick``: a smoke run under 2 minutes).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _common import base_parser, markdown_table, write_results  # noqa: E402

try:
    import blackjax
    import blackjax.sgmcmc.diffusions as bj_diffusions
    import blackjax.sgmcmc.gradients as bj_gradients
except ImportError:  # an optional peer: say how to get it, and do not fail run_all
    print(
        "bench_peers.py needs BlackJAX: pip install 'blackjax==1.7.1' (the bench "
        "extra); skipped."
    )
    sys.exit(0)

import cenlmc_jax as cj  # noqa: E402
from cenlmc_jax import diagnostics as dg  # noqa: E402
from cenlmc_jax.gradients.estimators import floyd_subset  # noqa: E402

D = 10


# ----------------------------------------------------------------- the harness


def scan_runner(step, num_chains, num_steps, stats):
    """jit((key, states) -> (states, per-step stats)): ``step`` vmapped over chains
    inside a lax.scan.

    ``stats(states, info) -> tuple of per-step values`` (reduced over chains, or small).
    """
    vstep = jax.vmap(step)

    def body(states, key):
        states, info = vstep(jax.random.split(key, num_chains), states)
        return states, stats(states, info)

    @jax.jit
    def run(key, states):
        return lax.scan(body, states, jax.random.split(key, num_steps))

    return run


def block(x):
    return jax.block_until_ready(x)


def paired_timing(run_a, args_a, run_b, args_b, repeats):
    """Interleaved timing: per-pair ratios t_a / t_b (order alternates), wall and
    process CPU time.

    The CPU-time ratio (work done by this process, all threads) is the steadier
    figure on a shared machine: other jobs stretch the wall time of whichever
    call they overlap, not its CPU time.
    """
    block(run_a(*args_a))  # compile both first
    block(run_b(*args_b))
    wall, cpu = {"a": [], "b": []}, {"a": [], "b": []}
    for r in range(repeats):
        order = (("a", run_a, args_a), ("b", run_b, args_b))
        for name, fn, args in order if r % 2 == 0 else order[::-1]:
            c0, t0 = time.process_time(), time.perf_counter()
            block(fn(*args))
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    ratios = [a / b for a, b in zip(wall["a"], wall["b"], strict=True)]
    cpu_ratios = [a / b for a, b in zip(cpu["a"], cpu["b"], strict=True)]
    return dict(
        ratio=statistics.median(ratios),
        ratio_min=min(ratios),
        ratio_max=max(ratios),
        cpu_ratio=statistics.median(cpu_ratios),
        cpu_ratio_min=min(cpu_ratios),
        cpu_ratio_max=max(cpu_ratios),
        cj_s=statistics.median(wall["a"]),
        bj_s=statistics.median(wall["b"]),
        ratios=ratios,
        cpu_ratios=cpu_ratios,
    )


def broadcast(state, n):
    return jax.tree_util.tree_map(
        lambda a: jnp.broadcast_to(a, (n,) + jnp.shape(a)), state
    )


def start_points(num_chains, scale=1.0, seed=0):
    return scale * jax.random.normal(jax.random.key(seed), (num_chains, D))


# --------------------------------------------------------------------- the rows


def row_rwmh(target, step_size, args, label):
    x0 = start_points(args.chains, 0.1)
    cj_algo = cj.rwmh(target.logdensity_fn, step_size)
    bj_algo = blackjax.normal_random_walk(target.logdensity_fn, step_size)
    stats = lambda s, i: (i.is_accepted, jnp.mean(i.acceptance_rate))
    run_c = scan_runner(cj_algo.step, args.chains, args.steps, stats)
    run_b = scan_runner(bj_algo.step, args.chains, args.steps, stats)
    sc, sb = jax.vmap(cj_algo.init)(x0), jax.vmap(bj_algo.init)(x0)
    key = jax.random.key(1)
    (fc, (acc_c, rate_c)), (fb, (acc_b, rate_b)) = run_c(key, sc), run_b(key, sb)
    timing = paired_timing(run_c, (key, sc), run_b, (key, sb), args.repeats)
    return dict(
        comparison=f"rwmh vs normal_random_walk ({label}, step {step_size:g})",
        **timing,
        same_decisions=float(jnp.mean(acc_c == acc_b)),
        max_abs_diff=float(jnp.max(jnp.abs(fc.position - fb.position))),
        acc_cj=float(rate_c.mean()),
        acc_bj=float(rate_b.mean()),
    )


def row_mala(target, step_size, args, label):
    x0 = (
        target.data["theta_map"] + start_points(args.chains, 0.05)
        if target.data
        else start_points(args.chains)
    )
    prop = cj.irreversible.sde_proposal(
        1.0, 0.0, target.logdensity_fn, step_size, grad_mode="reverse"
    )  # blackjax.mala: jax.grad
    cj_algo = cj.irreversible_mh(target.logdensity_fn, prop)
    bj_algo = blackjax.mala(target.logdensity_fn, step_size)
    stats = lambda s, i: (
        i.is_accepted,
        jnp.mean(i.acceptance_rate),
        jnp.mean(s.position, 0),
        jnp.mean(s.position**2, 0),
    )
    run_c = scan_runner(cj_algo.step, args.chains, args.steps, stats)
    run_b = scan_runner(bj_algo.step, args.chains, args.steps, stats)
    sc, sb = jax.vmap(cj_algo.init)(x0), jax.vmap(bj_algo.init)(x0)
    key = jax.random.key(2)
    (fc, (acc_c, rate_c, m1c, m2c)), (fb, (acc_b, rate_b, m1b, m2b)) = (
        run_c(key, sc),
        run_b(key, sb),
    )
    timing = paired_timing(run_c, (key, sc), run_b, (key, sb), args.repeats)
    half = (
        args.steps // 2
    )  # second half: the moments of the two runs (same draws: equal up to rounding)
    return dict(
        comparison=f"mala: sde_proposal(D=1, Q=0) vs blackjax.mala ({label}, step "
        f"{step_size:g})",
        **timing,
        same_decisions=float(jnp.mean(acc_c == acc_b)),
        max_abs_diff=float(jnp.max(jnp.abs(fc.position - fb.position))),
        acc_cj=float(rate_c.mean()),
        acc_bj=float(rate_b.mean()),
        mean_x0_cj=float(m1c[half:, 0].mean()),
        mean_x0_bj=float(m1b[half:, 0].mean()),
        var_diff=float(
            jnp.max(
                jnp.abs((m2c - m1c**2)[half:].mean(0) - (m2b - m1b**2)[half:].mean(0))
            )
        ),
    )


def row_lmc_sgld(args):
    target = cj.models.targets.standard_gaussian(D)
    h = 0.1
    x0 = start_points(args.chains)
    lmc = cj.lmc(target.logdensity_fn, h)
    grad = jax.grad(target.logdensity_fn)
    sgld = blackjax.sgld(lambda x, batch: grad(x))

    def lmc_run_fn():
        def body(state, key):
            state, _ = lmc.step(key, state)
            return state, jnp.mean(state.position**2)

        @jax.jit
        def run(key, state):
            return lax.scan(body, state, jax.random.split(key, args.steps))

        return run

    def sgld_step(key, x):
        return sgld.step(key, x, None, h), None

    run_c = lmc_run_fn()
    run_b = scan_runner(sgld_step, args.chains, args.steps, lambda s, i: jnp.mean(s**2))
    sc = lmc.init(x0)
    key = jax.random.key(3)
    (_, m2c), (_, m2b) = run_c(key, sc), run_b(key, x0)
    timing = paired_timing(run_c, (key, sc), run_b, (key, x0), args.repeats)
    half = args.steps // 2
    return dict(
        comparison=f"lmc (ensemble of {args.chains}) vs sgld, full gradient (gaussian, "
        f"h {h:g})",
        **timing,
        var_cj=float(m2c[half:].mean()),
        var_bj=float(m2b[half:].mean()),
        var_exact=1.0 / (1.0 - h / 2),
    )


def row_sgrhmc(args):
    target = cj.models.targets.standard_gaussian(D)
    eps = 0.05
    grad = jax.grad(target.logdensity_fn)
    est = cj.gradients.grad_estimator_from_grad(grad)
    cj_step = lambda k, s: cj.sgmcmc.sgrhmc_step(k, s, est, eps, 1.0)
    bj_int = bj_diffusions.sghmc(alpha=1.0)

    def bj_step(key, state):
        x, p = state
        _, key_noise = jax.random.split(key)  # the documented split of sgrhmc_step
        return bj_int(key_noise, x, p, grad(x), eps), None

    x0 = start_points(args.chains)
    sc = jax.vmap(cj.sgmcmc.sgrhmc_init)(x0)
    sb = (x0, jnp.zeros_like(x0))
    run_c = scan_runner(
        cj_step, args.chains, args.steps, lambda s, i: jnp.mean(s.position**2)
    )
    run_b = scan_runner(
        bj_step, args.chains, args.steps, lambda s, i: jnp.mean(s[0] ** 2)
    )
    key = jax.random.key(4)
    (fc, _), (fb, _) = run_c(key, sc), run_b(key, sb)
    timing = paired_timing(run_c, (key, sc), run_b, (key, sb), args.repeats)
    return dict(
        comparison="sgrhmc_step, inv_metric 1 vs SGHMC diffusion alpha=1 (gaussian, "
        f"step {eps:g})",
        **timing,
        max_abs_diff=float(jnp.max(jnp.abs(fc.position - fb[0]))),
        max_rel_diff=float(
            jnp.max(jnp.abs(fc.position - fb[0]) / (1e-6 + jnp.abs(fb[0])))
        ),
    )


def row_sghmc(args, replace):
    t = cj.models.targets.logistic_regression(num_data=args.num_data, dim=D)
    data = (
        jnp.asarray(t.data["x"], jnp.float32),
        jnp.asarray(t.data["y"], jnp.float32),
    )
    n, b, eps = args.num_data, args.batch, 1e-3
    est = cj.gradients.minibatch_grad_estimator(
        t.data["logprior_fn"], t.data["loglik_fn"], data, b, replace=replace
    )
    sghmc = cj.sghmc(est, eps, friction=1.0)
    bj_grad = bj_gradients.grad_estimator(
        t.data["logprior_fn"], lambda th, xy: t.data["loglik_fn"](th, *xy), n
    )
    bj_int = bj_diffusions.sghmc(alpha=1.0)

    def bj_step(key, state):
        x, p = state
        key_grad, key_noise = jax.random.split(key)
        idx = (
            jax.random.randint(key_grad, (b,), 0, n, dtype=jnp.int32)
            if replace
            else floyd_subset(key_grad, n, b)
        )
        batch = (jnp.take(data[0], idx, axis=0), jnp.take(data[1], idx, axis=0))
        return bj_int(key_noise, x, p, bj_grad(x, batch), eps), None

    x0 = jnp.asarray(t.data["theta_map"], jnp.float32) + start_points(args.chains, 0.05)
    sc = jax.vmap(sghmc.init)(x0)
    sb = (x0, jnp.zeros_like(x0))
    run_c = scan_runner(
        sghmc.step, args.chains, args.steps, lambda s, i: jnp.mean(s.position, 0)
    )
    run_b = scan_runner(
        bj_step, args.chains, args.steps, lambda s, i: jnp.mean(s[0], 0)
    )
    key = jax.random.key(5)
    (fc, mc), (fb, mb) = run_c(key, sc), run_b(key, sb)
    timing = paired_timing(run_c, (key, sc), run_b, (key, sb), args.repeats)
    scheme = "with replacement" if replace else "Floyd subsets"
    return dict(
        comparison=f"sghmc, minibatch {b} of {n} ({scheme}) vs SGHMC diffusion, same "
        "minibatch",
        **timing,
        max_abs_diff=float(jnp.max(jnp.abs(fc.position - fb[0]))),
        mean_x0_cj=float(mc[:, 0].mean()),
        mean_x0_bj=float(mb[:, 0].mean()),
    )


def minibatch_rows(args):
    t = cj.models.targets.logistic_regression(num_data=args.num_data, dim=D)
    data = (
        jnp.asarray(t.data["x"], jnp.float32),
        jnp.asarray(t.data["y"], jnp.float32),
    )
    n = args.num_data
    grad_lik = jax.vmap(jax.grad(t.data["loglik_fn"]), in_axes=(None, 0, 0))

    def old_estimator(
        key, theta
    ):  # the draw before issue 10: a full permutation per call
        idx = jax.random.choice(key, n, (b,), replace=False)
        return jnp.sum(
            grad_lik(theta, jnp.take(data[0], idx, 0), jnp.take(data[1], idx, 0)), 0
        ) * (n / b)

    rows = []
    for b in args.batches:
        variants = {
            "replace=True (default)": cj.gradients.minibatch_grad_estimator(
                t.data["logprior_fn"], t.data["loglik_fn"], data, b
            ),
            "replace=False (Floyd)": cj.gradients.minibatch_grad_estimator(
                t.data["logprior_fn"], t.data["loglik_fn"], data, b, replace=False
            ),
            "choice(replace=False) (before)": old_estimator,
        }
        theta = jnp.zeros((args.chains, D))
        base = None
        for name, est in variants.items():
            f = jax.jit(
                lambda k, th, est=est: jax.vmap(est)(
                    jax.random.split(k, args.chains), th
                )
            )
            block(f(jax.random.key(0), theta))
            times = []
            for r in range(args.repeats):
                t0 = time.perf_counter()
                block(f(jax.random.key(r), theta))
                times.append(time.perf_counter() - t0)
            ms = statistics.median(times) * 1e3
            base = base or ms
            rows.append(
                dict(batch=b, draw=name, ms_per_call=ms, ratio_vs_replace=ms / base)
            )
            print(
                f"  minibatch b={b:4d} {name:32s} {ms:8.2f} ms per call of "
                f"{args.chains} chains",
                flush=True,
            )
    return rows


# --------------------------------------------------------------------- Q-sweep


def pair_rotation(d):
    """J with J[2i, 2i+1] = -1, J[2i+1, 2i] = 1: rotations in the planes (0, 1), (2, 3),
    ..."""
    J = np.zeros((d, d))
    for i in range(0, d - 1, 2):
        J[i, i + 1], J[i + 1, i] = -1.0, 1.0
    return J


def q_sweep(args):
    """ESS per gradient of sde_proposal with Q = c·J against MALA (c = 0), each tuned to
    acceptance 0.574."""
    cases = [  # (name, target, preconditioner, Q scales)
        ("banana, D = I", cj.models.targets.banana(), None, args.q_scales),
        (
            "correlated gaussian d=2 rho=0.95, D = I",
            cj.models.targets.correlated_gaussian(2, 0.95),
            None,
            args.q_scales + [8.0],
        ),
        (
            "correlated gaussian d=2 rho=0.95, dense D",
            cj.models.targets.correlated_gaussian(2, 0.95),
            "dense",
            args.q_scales[:2],
        ),
        (
            "logistic regression d=6, diagonal D",
            cj.models.targets.logistic_regression(dim=6),
            "diagonal",
            args.q_scales,
        ),
    ]
    rows = []
    for name, target, precond, scales in cases[: args.sweep_cases]:
        d = target.dim
        J = pair_rotation(d)
        for c in sorted(set(scales)):
            per_seed = []
            for seed in range(args.sweep_seeds):
                x0 = 0.5 * jax.random.normal(
                    jax.random.key(10 + seed), (args.sweep_chains, d)
                )
                if target.data is not None:
                    x0 = x0 * 0.2 + jnp.asarray(target.data["theta_map"], jnp.float32)
                warm = cj.adaptation.window_adaptation(
                    "sde" if c else "mala",
                    target.logdensity_fn,
                    Q=c * J if c else None,
                    preconditioner=precond,
                    initial_step_size=0.1,
                )
                (states, params), _ = warm.run_chains(
                    jax.random.key(20 + seed), x0, args.sweep_warmup
                )
                algo = cj.vmap_chains(warm.sampler(params))
                res = cj.sample(
                    jax.random.key(30 + seed), algo, states, args.sweep_steps
                )
                x = np.swapaxes(
                    np.asarray(res.trace, np.float64), 0, 1
                )  # (chains, draws, d)
                ess_x = np.asarray(
                    dg.effective_sample_size(x, chain_axis=0, sample_axis=1)
                )
                ess_x2 = np.asarray(
                    dg.effective_sample_size(x**2, chain_axis=0, sample_axis=1)
                )
                grads = float(np.sum(np.asarray(res.info.grad_evals)))
                per_seed.append(
                    (
                        float(params["step_size"]),
                        float(np.mean(np.asarray(res.info.acceptance_rate))),
                        ess_x.min() / grads,
                        ess_x2.min() / grads,
                    )
                )
            a = np.array(per_seed)
            rows.append(
                dict(
                    target=name,
                    q_scale=c,
                    step_size=float(a[:, 0].mean()),
                    acceptance=float(a[:, 1].mean()),
                    min_ess_x_per_grad=float(a[:, 2].mean()),
                    min_ess_x2_per_grad=float(a[:, 3].mean()),
                    spread_x=f"{a[:, 2].min():.4f}-{a[:, 2].max():.4f}",
                    spread_x2=f"{a[:, 3].min():.4f}-{a[:, 3].max():.4f}",
                )
            )
            r = rows[-1]
            print(
                f"  Q-sweep {name:42s} c={c:4g} eps={r['step_size']:.3g} "
                f"acc={r['acceptance']:.3f} ESS/grad x {r['min_ess_x_per_grad']:.4f} "
                f"({r['spread_x']}) x² {r['min_ess_x2_per_grad']:.4f} "
                f"({r['spread_x2']})",
                flush=True,
            )
    for r in (
        rows
    ):  # relative to MALA on the same target (the D = I case for the dense-D rows too)
        base_name = r["target"].replace("dense D", "D = I")
        base = next(
            (b for b in rows if b["target"] == base_name and b["q_scale"] == 0), r
        )
        r["x_vs_mala"] = r["min_ess_x_per_grad"] / base["min_ess_x_per_grad"]
        r["x2_vs_mala"] = r["min_ess_x2_per_grad"] / base["min_ess_x2_per_grad"]
    return rows


# ------------------------------------------------------------------------ main


def fmt_row(r):
    out = {
        "comparison": r["comparison"],
        "wall-time ratio (median [min, max])": f"{r['ratio']:.2f} "
        f"[{r['ratio_min']:.2f}, {r['ratio_max']:.2f}]",
        "CPU-time ratio": f"{r['cpu_ratio']:.2f} [{r['cpu_ratio_min']:.2f}, "
        f"{r['cpu_ratio_max']:.2f}]",
        "ms/step (cj, bj)": f"{r['cj_s'] / r['steps'] * 1e3:.3f}, "
        f"{r['bj_s'] / r['steps'] * 1e3:.3f}",
    }
    checks = []
    if "same_decisions" in r:
        checks.append(f"same decisions {100 * r['same_decisions']:.2f}%")
    if "acc_cj" in r:
        checks.append(f"acceptance {r['acc_cj']:.4f} vs {r['acc_bj']:.4f}")
    if "max_abs_diff" in r:
        checks.append(f"max abs diff of final positions {r['max_abs_diff']:.2g}")
    if "var_exact" in r:
        checks.append(
            f"variance {r['var_cj']:.4f} vs {r['var_bj']:.4f} (ULA exact "
            f"{r['var_exact']:.4f})"
        )
    if "mean_x0_cj" in r:
        checks.append(f"mean x0 {r['mean_x0_cj']:.4f} vs {r['mean_x0_bj']:.4f}")
    if "var_diff" in r:
        checks.append(f"max variance difference {r['var_diff']:.2g}")
    out["equality checks"] = "; ".join(checks)
    return out


def main():
    parser = base_parser(" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--chains", type=int, default=1000)
    parser.add_argument(
        "--steps", type=int, default=100, help="steps per timed (jitted lax.scan) call"
    )
    parser.set_defaults(repeats=11)  # short calls: more pairs for the median ratio
    parser.add_argument(
        "--num-data", type=int, default=10_000, help="data points of the minibatch rows"
    )
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 100])
    parser.add_argument(
        "--q-scales", type=float, nargs="+", default=[0.0, 0.5, 1.0, 2.0, 4.0]
    )
    parser.add_argument("--sweep-chains", type=int, default=200)
    parser.add_argument(
        "--sweep-seeds",
        type=int,
        default=2,
        help="independent runs per Q-sweep entry (averaged)",
    )
    parser.add_argument(
        "--sweep-cases",
        type=int,
        default=4,
        help="how many of the Q-sweep's 4 targets to run",
    )
    parser.add_argument("--sweep-warmup", type=int, default=600)
    parser.add_argument("--sweep-steps", type=int, default=2000)
    args = parser.parse_args()
    if args.quick:
        args.chains, args.steps, args.repeats = 200, 30, 3
        args.num_data, args.batches = 2000, [32]
        args.q_scales, args.sweep_chains, args.sweep_warmup, args.sweep_steps = (
            [0.0, 2.0],
            64,
            200,
            300,
        )
        args.sweep_seeds, args.sweep_cases = 1, 2

    gauss = cj.models.targets.standard_gaussian(D)
    logistic = cj.models.targets.logistic_regression(dim=D)
    steps_mala_gauss = [0.3, 0.6, 1.0] if not args.quick else [0.6]
    steps_mala_logit = [0.003, 0.006, 0.012] if not args.quick else [0.006]
    rows = []

    def add(r):
        r["steps"] = args.steps
        r["chains"] = args.chains
        rows.append(r)
        print(
            f"{r['comparison']:80s} ratio {r['ratio']:.2f} [{r['ratio_min']:.2f}, "
            f"{r['ratio_max']:.2f}] cpu {r['cpu_ratio']:.2f} "
            f"[{r['cpu_ratio_min']:.2f}, {r['cpu_ratio_max']:.2f}]  "
            f"{fmt_row(r)['equality checks']}",
            flush=True,
        )

    add(row_rwmh(gauss, 0.5, args, "gaussian"))
    add(row_rwmh(logistic, 0.05, args, "logistic"))
    add(row_lmc_sgld(args))
    add(row_sgrhmc(args))
    for eps in steps_mala_gauss:
        add(row_mala(gauss, eps, args, "gaussian"))
    for eps in steps_mala_logit:
        add(row_mala(logistic, eps, args, "logistic"))
    add(row_sghmc(args, replace=True))
    add(row_sghmc(args, replace=False))
    print("minibatch draw alone:", flush=True)
    mb_rows = minibatch_rows(args)
    print("Q-sweep:", flush=True)
    sweep = q_sweep(args)

    notes = [
        f"BlackJAX {blackjax.__version__}; {args.chains} chains vmapped, d = {D}, "
        f"{args.steps} steps per jitted lax.scan call; interleaved timing, median over "
        f"{args.repeats} pairs of the ratio t_cenlmc / t_blackjax (< 1: cenlmc_jax "
        "faster), in wall time and in this process's CPU time (all threads; the "
        "steadier figure when other jobs share the machine). The machine is shared (2 "
        "cores): absolute times are noisy.",
        "same decisions: share of chain-steps where both samplers accepted or rejected "
        "alike, from the same keys; max abs diff: of the final positions after all "
        "steps (0: bit-identical draws; a difference with 100% same decisions is "
        "float32 rounding of the gradient's sum, fused differently by XLA in the two "
        "programs). sgrhmc_step writes r + ε(G^{-1/2} g - G^{-1} r) where BlackJAX "
        "writes (1 - ε) r + ε g: equal up to rounding. lmc and sgld draw their noise "
        "from different keys by design: compared by the variance.",
    ]
    md_rows = [fmt_row(r) for r in rows]
    payload = dict(
        args={k: (str(v) if k == "out_dir" else v) for k, v in vars(args).items()},
        minibatch=mb_rows,
        q_sweep=sweep,
    )
    _, md_path = write_results(
        "peers",
        payload,
        rows,
        out_dir=args.out_dir,
        md_rows=md_rows,
        columns=[
            "comparison",
            "wall-time ratio (median [min, max])",
            "CPU-time ratio",
            "ms/step (cj, bj)",
            "equality checks",
        ],
        title="cenlmc_jax vs BlackJAX: per-step time and equal draws",
        notes=notes,
    )
    extra = [
        "",
        f"## The minibatch draw alone ({args.chains} chains, n = {args.num_data}, d = "
        f"{D}; one estimator call)",
        "",
        markdown_table(mb_rows, ["batch", "draw", "ms_per_call", "ratio_vs_replace"]),
        "## Irreversible vs reversible: sde_proposal with Q = c·J against MALA (c = 0)",
        "",
        "Each sampler tuned by `cj.adaptation.window_adaptation` (pooled over "
        f"{args.sweep_chains} chains, {args.sweep_warmup} warm-up steps) to acceptance "
        f"0.574, then {args.sweep_steps} steps; J rotates the coordinate pairs (0, 1), "
        "(2, 3), ... (in whitened coordinates where a diagonal preconditioner is "
        "adapted). One gradient per step for every c, so ESS per gradient is ESS per "
        "step. min over coordinates of the ESS of x and of x², mean over "
        f"{args.sweep_seeds} independent runs (spread: their min-max); x_vs_mala: "
        "ratio to c = 0 with the same target (and D = I for the dense-D rows).",
        "",
        markdown_table(
            sweep,
            [
                "target",
                "q_scale",
                "step_size",
                "acceptance",
                "min_ess_x_per_grad",
                "spread_x",
                "min_ess_x2_per_grad",
                "spread_x2",
                "x_vs_mala",
                "x2_vs_mala",
            ],
        ),
    ]
    md_path.write_text(md_path.read_text() + "\n".join(extra))
    print("wrote", md_path)


if __name__ == "__main__":
    main()
