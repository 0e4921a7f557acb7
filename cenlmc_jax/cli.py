"""The batch-job command: ``cenlmc-jax sample``.

``cenlmc-jax sample`` with no arguments runs the default sampler on the
default built-in target and prints a short summary. Flags choose the sampler,
target, particles, steps, step size, seed and an ``.npz`` output file. The
run streams moments (``mode="stream"``), so memory stays O(N d).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable, NamedTuple

import jax
import numpy as np

import cenlmc_jax as cj
from cenlmc_jax import targets as targets_mod
from cenlmc_jax import tuning
from cenlmc_jax.base import SamplingAlgorithm


class Job(NamedTuple):
    """A sampler set up for the CLI: its object, its initial state and a description."""

    algorithm: SamplingAlgorithm
    state: object
    description: str


def _lmc(args, target, positions):
    h = args.step_size or 0.05
    algo = cj.lmc(target.logdensity_fn, h)
    return Job(algo, algo.init(positions), f"LMC (unadjusted Langevin), h={h}")


def _cenlmc_params(args, target, h):
    """Flags where given, else ``tuning.suggest_cenlmc_params`` for this d, h and N."""
    sug = tuning.suggest_cenlmc_params(target.dim, h, num_particles=args.particles)
    pick = lambda flag, default: default if flag is None else flag  # noqa: E731
    return (pick(args.eta, sug.eta), pick(args.r1, sug.r1), pick(args.r2, sug.r2),
            min(pick(args.n_star, sug.n_star), args.particles - 1), pick(args.m_f, sug.m_f))


def _cenlmc(args, target, positions):
    h = args.step_size or 0.05
    eta, r1, r2, n_star, m_f = _cenlmc_params(args, target, h)
    algo = cj.cenlmc(target.logdensity_fn, h, eta, r1, r2, n_star, m_f, f_star=target.f_star)
    return Job(algo, algo.init(positions), f"CEnLMC (constrained ensemble Langevin), h={h}, eta={eta:.3g}, "
                                           f"r1={r1:.3g}, r2={r2:.3g}, n_star={n_star}, m_f={m_f:.3g}")


def _enlmc(args, target, positions):
    h = args.step_size or 0.05
    eta = args.eta if args.eta is not None else _cenlmc_params(args, target, h)[0]
    algo = cj.enlmc(target.logdensity_fn, h, eta)
    return Job(algo, algo.init(positions),
               f"EnLMC (unconstrained ensemble Langevin; provably unstable), h={h}, eta={eta:.3g}")


def _sgrhmc(args, target, positions):
    """SGRHMC with the gSGRHMC metric, one chain per 'particle', noisy gradients
    (true gradient + N(0, grad_noise²)) when --grad-noise > 0."""
    eps = args.step_size or 0.05
    est = (cj.noisy_grad_estimator(jax.grad(target.logdensity_fn), args.grad_noise) if args.grad_noise > 0
           else cj.grad_estimator_from_logdensity(target.logdensity_fn))
    inv_metric = cj.gsgrhmc_inv_metric(lambda x: -target.logdensity_fn(x) - target.f_star)
    algo = cj.vmap_chains(cj.sgrhmc(est, eps, inv_metric))
    return Job(algo, algo.init(positions),
               f"gSGRHMC (metric 1.5 sqrt|U - U* + 0.5|), eps={eps}, gradient noise sd {args.grad_noise}")


def _irreversible_mh(args, target, positions):
    scale = args.step_size or 0.8
    algo = cj.vmap_chains(cj.irreversible_mh(target.logdensity_fn, cj.gamma_proposal(2.0, scale)))
    state = algo.init(positions, jax.random.key(args.seed + 1))
    return Job(algo, state, f"irreversible MH, Gamma(2, {scale}) proposal, one chain per particle")


def _rwmh(args, target, positions):
    h = args.step_size or 2.0
    algo = cj.vmap_chains(cj.rwmh(target.logdensity_fn, h))
    return Job(algo, algo.init(positions), f"random-walk MH, N(0, {h}^2) proposal, one chain per particle")


SAMPLERS: dict[str, Callable] = {
    "cenlmc": _cenlmc,
    "enlmc": _enlmc,
    "lmc": _lmc,
    "sgrhmc": _sgrhmc,
    "irreversible-mh": _irreversible_mh,
    "rwmh": _rwmh,
}
DEFAULT_SAMPLER = "cenlmc"


def _summary_rows(target, moments):
    mean, sd = np.asarray(moments.mean), np.asarray(moments.std)
    rows = []
    for k in range(min(target.dim, 6)):
        true_mean = "" if target.mean is None else f"{target.mean[k]: .4f}"
        true_sd = "" if target.cov is None else f"{np.sqrt(target.cov[k, k]): .4f}"
        rows.append(f"  x[{k}]  mean {mean[k]: .4f} (true {true_mean or '  n/a'})   sd {sd[k]: .4f} (true {true_sd or '  n/a'})")
    if target.dim > 6:
        rows.append(f"  ... {target.dim - 6} more coordinates")
    return rows


def cmd_sample(args) -> int:
    target = targets_mod.get_target(args.target, args.dim)
    key = jax.random.key(args.seed)
    init_key, run_key = jax.random.split(key)
    positions = jax.random.normal(init_key, (args.particles, target.dim)) * args.init_scale
    job = SAMPLERS[args.sampler](args, target, positions)
    print(f"cenlmc-jax: {job.description}")
    print(f"  target {target.name} (d={target.dim}), {args.particles} particles, "
          f"{args.burn_in} burn-in + {args.steps} steps, seed {args.seed}, backend {jax.default_backend()}")
    t0 = time.perf_counter()
    res = cj.sample(run_key, job.algorithm, job.state, args.steps, burn_in=args.burn_in, mode="stream",
                 progress=args.progress, on_divergence="stop")
    jax.block_until_ready(res.state)
    elapsed = time.perf_counter() - t0
    info = res.info
    grad_evals = int(np.sum(np.asarray(info.grad_evals, np.int64)))
    full = res.num_steps_done * args.particles
    print(f"  ran {res.num_steps_done} steps in {elapsed:.2f} s (compilation included)")
    print(f"  gradient evaluations: {grad_evals:,} ({grad_evals / full:.1%} of one per particle-step)")
    if args.sampler in ("cenlmc", "enlmc"):
        print(f"  saved against LMC (N gradients per step): {full - grad_evals:,} ({1 - grad_evals / full:.1%})")
    if hasattr(info, "acceptance_rate"):
        print(f"  mean acceptance rate {float(np.mean(np.asarray(info.acceptance_rate))):.3f}")
    if hasattr(info, "ensemble_fraction"):
        frac = np.asarray(info.ensemble_fraction)[args.burn_in:]
        print(f"  ensemble force used by {frac.mean():.1%} of particle-steps after burn-in")
    if res.diverged_at >= 0:
        print(f"  DIVERGED at step {res.diverged_at} (info.diverged: non-finite or exploding values); "
              "the run stopped and its estimates are not valid")
    if float(res.moments.count) > 0:
        print("  estimates over kept steps and particles:")
        print("\n".join(_summary_rows(target, res.moments)))
    if args.output:
        np.savez(
            args.output,
            final_position=np.asarray(res.state.position),
            mean=np.asarray(res.moments.mean),
            variance=np.asarray(res.moments.variance),
            **{f"info_{k}": np.asarray(v) for k, v in res.info._asdict().items()},
        )
        print(f"  wrote {args.output}")
    return 1 if res.diverged_at >= 0 else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cenlmc-jax", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser("sample", help="run a sampler on a built-in target and print a summary")
    p.add_argument("--sampler", choices=sorted(SAMPLERS), default=DEFAULT_SAMPLER)
    p.add_argument("--target", choices=sorted(targets_mod.TARGETS), default="gaussian")
    p.add_argument("--dim", type=int, default=None, help="dimension, for targets that take one")
    p.add_argument("--particles", type=int, default=2000)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--burn-in", type=int, default=200)
    p.add_argument("--step-size", type=float, default=None,
                   help="step size h (Langevin), eps (SGRHMC) or proposal scale (MH); default per sampler")
    for name, kind in (("eta", float), ("r1", float), ("r2", float), ("n-star", int), ("m-f", float)):
        p.add_argument(f"--{name}", type=kind, default=None,
                       help=f"cenlmc/enlmc: {name.replace('-', '_')} (default: tuning.suggest_cenlmc_params)")
    p.add_argument("--grad-noise", type=float, default=0.0, help="sgrhmc: sd of Gaussian noise added to gradients")
    p.add_argument("--init-scale", type=float, default=1.0, help="initial particles ~ N(0, scale^2 I)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default=None, help="write final particles, moments and infos to this .npz")
    p.add_argument("--progress", action="store_true", help="show a progress bar (needs tqdm)")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if args.command == "sample":
        for name in ("particles", "steps"):
            if getattr(args, name) < 1:
                parser.error(f"--{name} must be >= 1; got {getattr(args, name)}")
        if args.burn_in < 0:
            parser.error(f"--burn-in must be >= 0; got {args.burn_in}")
        if args.step_size is not None and not args.step_size > 0:
            parser.error(f"--step-size must be > 0; got {args.step_size}")
        return cmd_sample(args)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
