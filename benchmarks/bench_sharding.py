"""Sharded ensemble force vs one device: the cost of shard_map, gathers and the ring.

Forces ``--devices`` (default 4) CPU devices with
``XLA_FLAGS=--xla_force_host_platform_device_count`` (set at the top of this
script, before JAX starts) and times, for a few N (d = 10, with ``w``):

* ``single``: ``pairwise.ensemble_force(method="tiled")`` on one device;
* ``sharded_1``: ``ensemble_force(..., mesh=...)`` on a 1-device mesh (the
  local XLA tiles of ``pairwise.tiled`` inside ``shard_map``, no communication);
* ``allgather_P`` / ``ring_P``: the two strategies on P devices.

Then one CEnLMC step (``cenlmc_step(..., mesh=...)``, d = 2, a target whose
gradient costs a small MLP's backward pass, so that the gradients are the
expensive part) in three variants:

* ``single``: one device;
* ``unsplit_P``: on P devices with the gradients as before issue 16: the
  pair force sharded, the true gradients of the flagged particles compacted
  and computed unsplit, replicated on every device (this script reproduces
  it by calling ``needed_grads`` without the mesh);
* ``split_P``: on P devices, each device compacting and differentiating its
  own particles (``buffers.sharded_needed_grads``, the default).

at two states: ``start`` (step 0: every particle needs a gradient) and
``steady`` (after 40 steps: the flagged ones and the audit's). Besides time
it reports ``grad_rows_per_device``, the largest gradient batch in the
compiled step's per-device program (the rows of its MLP product), from the
compiled HLO.

On a CPU the P "devices" share the machine's cores, so this measures overhead
(collectives, padding, the per-device programs) and the work split, not a multi-GPU
speed-up: ``ratio`` = time / time of ``single``. Run: ``python
benchmarks/bench_sharding.py`` (``--quick`` for a smoke run). Writes
results/sharding.{json,md}.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time


def _devices_flag(argv) -> int:
    for i, a in enumerate(argv):
        if a == "--devices" and i + 1 < len(argv):
            return int(argv[i + 1])
        if a.startswith("--devices="):
            return int(a.split("=", 1)[1])
    return 4


# Must happen before JAX creates its CPU backend (i.e. before importing it).
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + f" --xla_force_host_platform_device_count={_devices_flag(sys.argv)}"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from _common import base_parser, markdown_table, time_call, write_results  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import functools  # noqa: E402
import re  # noqa: E402
from unittest import mock  # noqa: E402

import jax.numpy as jnp  # noqa: E402

import cenlmc_jax as cj  # noqa: E402
from cenlmc_jax.ensemble import audit as audit_module  # noqa: E402
from cenlmc_jax.ensemble.buffers import needed_grads  # noqa: E402
from cenlmc_jax.pairwise import ensemble_force, make_mesh  # noqa: E402

# the MLP's hidden width: a gradient of ~4 x 128² flops, the step's expensive part at d
# = 2
WIDTH = 128


def mlp_target(d: int, seed: int = 0):
    """``log π(x) = -|x|²/2 - 0.1 Σ tanh(W2 tanh(W1 x))``: a stand-in for a model whose
    gradient is costly."""
    rng = np.random.default_rng(seed)
    w1 = jnp.asarray(rng.normal(size=(WIDTH, d)) / np.sqrt(d), jnp.float32)
    w2 = jnp.asarray(rng.normal(size=(WIDTH, WIDTH)) / np.sqrt(WIDTH), jnp.float32)
    return lambda x: (
        -0.5 * jnp.sum(x * x) - 0.1 * jnp.sum(jnp.tanh(w2 @ jnp.tanh(w1 @ x)))
    )


def unsplit(grad_one, x, need, capacity, dense, mesh=None):
    """The gradients as before issue 16: compacted over all N particles, whatever the
    mesh."""
    return needed_grads(grad_one, x, need, capacity, dense)


def grad_rows(compiled) -> int:
    """The largest gradient batch of the compiled program: rows of a (rows, WIDTH) or
    (WIDTH, rows) tanh in a branch of the gradient call's ``lax.switch`` (the values of
    all particles are computed outside it)."""
    pattern = re.compile(r"f32\[(\d+),(\d+)\]\{[^}]*\} tanh\(")
    rows = []
    for line in compiled.as_text().splitlines():
        m = pattern.search(line) if "branch_" in line else None
        if m:
            a, b = int(m.group(1)), int(m.group(2))
            rows.append(b if a == WIDTH else a)
    return max(rows) if rows else 0


def cenlmc_rows(n: int, d: int, p: int, repeats: int) -> list[dict]:
    """The CEnLMC step rows (module docstring): single, unsplit_P, split_P at the start
    and steady states."""
    logdensity = mlp_target(d)
    x0 = jax.random.normal(jax.random.key(0), (n, d))
    f_star = (
        float(-np.max(np.asarray(jax.vmap(logdensity)(x0)))) - 10.0
    )  # below min f; M_f = inf switches it off
    h = 0.05
    params = dict(
        logdensity_fn=logdensity,
        step_size=h,
        eta=np.sqrt(h * d),
        r1=0.5,
        r2=np.sqrt(h * d),
        n_star=5,
        m_f=np.inf,
    )
    mesh = make_mesh(p)
    start = cj.ensemble.cenlmc_init(x0, logdensity, f_star=f_star)
    step1 = jax.jit(functools.partial(cj.ensemble.cenlmc_step, **params))
    steady = start
    for k in range(40):
        steady, _ = step1(jax.random.fold_in(jax.random.key(1), k), steady)
    variants = {
        "single": (None, False),
        f"unsplit_{p}": (mesh, True),
        f"split_{p}": (mesh, False),
    }
    rows = []
    for state_name, state in (("start", start), ("steady", steady)):
        compiled = {}
        for name, (m, old) in variants.items():
            with (
                mock.patch.object(audit_module, "needed_grads", unsplit)
                if old
                else contextlib.nullcontext()
            ):
                step = jax.jit(
                    functools.partial(cj.ensemble.cenlmc_step, **params, mesh=m)
                )
                compiled[name] = step.lower(jax.random.key(2), state).compile()
        # the variants' calls alternate (a load change on the shared machine hits all of
        # them alike)
        times = {name: [] for name in compiled}
        for _ in range(repeats):
            for name, fn in compiled.items():
                t0 = time.perf_counter()
                jax.block_until_ready(fn(jax.random.key(2), state))
                times[name].append(time.perf_counter() - t0)
        base = ref = None
        for name, fn in compiled.items():
            new, info = fn(jax.random.key(2), state)
            pos = np.asarray(new.position)
            ref = pos if ref is None else ref
            # the first call of each is left out
            median = float(np.median(times[name][1:]))
            base = median if base is None else base
            rows.append(dict(
                N=n, d=d, state=state_name, variant=name, median_s=median,
                ratio=median / base,
                grad_evals=int(info.grad_evals) + int(info.audit_grad_evals),
                grad_rows_per_device=grad_rows(fn),
                max_abs_diff_vs_single=float(np.max(np.abs(pos - ref))),
            ))  # fmt: skip
            print(rows[-1], flush=True)
    return rows


def inputs(n: int, d: int, seed: int = 0, h: float = 0.05):
    """CEnLMC-shaped ensemble with about 40 ball neighbours per particle."""
    from scipy.stats import chi2

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    xi = rng.normal(size=(n, d))
    w = x - np.sqrt(2 * h) * xi
    f = 0.5 * np.sum(x * x, axis=1)
    log_p = -0.5 * d * np.log(4 * np.pi * h) - 0.5 * np.sum(xi * xi, axis=1)
    eta = float(np.sqrt(2 * chi2.ppf(min(0.5, 40 / n), d)))
    r2 = float(np.sqrt(2 * (1 + 2 * h) * chi2.ppf(0.3, d)))
    c = lambda a: jax.numpy.asarray(a, np.float32)  # noqa: E731
    return (c(x), c(f), c(log_p), eta), dict(w=c(w), r2=r2)


def main():
    parser = base_parser(" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument(
        "--devices",
        type=int,
        default=4,
        help="forced CPU devices (read before JAX starts)",
    )
    parser.add_argument("--sizes", default="1024,4096,16384", help="comma-separated N")
    parser.add_argument("--dim", type=int, default=10)
    parser.add_argument(
        "--cenlmc-n", type=int, default=8192, help="N of the CEnLMC step rows (d = 2)"
    )
    args = parser.parse_args()
    sizes = [512, 2048] if args.quick else [int(s) for s in args.sizes.split(",")]
    repeats = 2 if args.quick else args.repeats
    p = len(jax.devices())
    mesh_p, mesh_1 = make_mesh(p), make_mesh(1)
    rows = []
    for n in sizes:
        a, kw = inputs(n, args.dim)
        variants = {
            "single": lambda: ensemble_force(*a, method="tiled", **kw),
            "sharded_1": lambda: ensemble_force(*a, mesh=mesh_1, **kw),
            f"allgather_{p}": lambda: ensemble_force(
                *a, mesh=mesh_p, strategy="allgather", **kw
            ),
            f"ring_{p}": lambda: ensemble_force(*a, mesh=mesh_p, strategy="ring", **kw),
        }
        base = None
        ref = None
        for name, fn in variants.items():
            t = time_call(fn, repeats=repeats)
            res = fn()
            if ref is None:
                ref = np.asarray(res.force_sum)
                base = t.median_s
            diff = float(
                np.max(np.abs(np.asarray(res.force_sum) - ref))
                / max(np.max(np.abs(ref)), 1e-30)
            )
            row = dict(
                N=n, d=args.dim, variant=name, median_s=t.median_s,
                first_call_s=t.first_call_s, ratio=t.median_s / base,
                pairs_per_s=f"{n * n / t.median_s:.3g}", max_rel_diff_vs_single=diff,
            )  # fmt: skip
            rows.append(row)
            print(row, flush=True)
    step_rows = cenlmc_rows(
        1024 if args.quick else args.cenlmc_n,
        2,
        p,
        3 if args.quick else max(repeats, 11),
    )
    json_path, md_path = write_results(
        "sharding",
        {"args": {k: str(v) for k, v in vars(args).items()}, "num_devices": p,
         "cenlmc_step": step_rows},
        rows,
        out_dir=args.out_dir,
        title=f"Sharded ensemble force on {p} forced CPU devices vs one device",
        columns=["N", "d", "variant", "median_s", "ratio", "pairs_per_s",
                 "first_call_s", "max_rel_diff_vs_single"],
        notes=[
            f"The {p} devices are XLA CPU devices forced on one machine: they share "
            f"its {os.cpu_count()} cores, so ratios measure overhead, not a "
            "multi-device speed-up.",
            "ratio = median time / median time of `single` (pairwise.ensemble_force, "
            "method='tiled').",
            "max_rel_diff_vs_single: max |force - single| / max |single| (float32 "
            "summation order).",
            "Timings on a shared, loaded machine are noisy: rerun on a quiet one.",
        ],
    )  # fmt: skip
    notes = [
        "One cenlmc_step (d = 2, eta = R2 = sqrt(h d), h = 0.05, r1 = 0.5, N* = 5, "
        f"M_f = inf) on a target whose gradient is an MLP's (width {WIDTH}); `start`: "
        "step 0 (every particle needs its gradient), `steady`: after 40 steps. ratio "
        "= median time / `single`'s at the same state; the variants' calls alternate, "
        "max(repeats, 11) rounds, the first left out.",
        f"`unsplit_{p}`: the gradients as before issue 16 (compacted over all N, "
        f"replicated on every device); `split_{p}`: each device its own N/{p} "
        "particles (buffers.sharded_needed_grads).",
        "grad_rows_per_device: the largest gradient batch in the compiled per-device "
        "program (its HLO); grad_evals: the step's needed + audited gradients; "
        "max_abs_diff_vs_single: of the new positions. At `steady` the single device's "
        "method='auto' sums the pairs block-sparse (N >= 8,192, d <= 3) and the mesh "
        "with dense tiles (block_sparse=None there): the difference is that summation "
        "order, the same for both mesh variants. The MLP's batched products may also "
        "round by the batch's rows (XLA's dot blocking: at N = 1,024 the split step "
        "differed by 1 ulp at `start`); elementwise gradients are bit for bit "
        "(tests/ensemble/test_sharded_gradients.py).",
        f"The {p} forced CPU devices share {os.cpu_count()} cores: the times measure "
        "overhead and the work split (the gradient rows each device runs), not a "
        "speed-up.",
    ]
    cols = [
        "N",
        "d",
        "state",
        "variant",
        "median_s",
        "ratio",
        "grad_evals",
        "grad_rows_per_device",
        "max_abs_diff_vs_single",
    ]
    with open(md_path, "a") as fh:
        fh.write("\n## One CEnLMC step: gradients split over the devices or not\n\n")
        fh.write(
            "".join(f"- {n}\n" for n in notes) + "\n" + markdown_table(step_rows, cols)
        )
    print(json_path, md_path)


if __name__ == "__main__":
    main()
