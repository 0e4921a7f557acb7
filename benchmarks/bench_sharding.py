"""Sharded ensemble force vs one device: the cost of shard_map, gathers and the ring.

Forces ``--devices`` (default 4) CPU devices with
``XLA_FLAGS=--xla_force_host_platform_device_count`` (set at the top of this
script, before JAX starts) and times, for a few N (d = 10, with ``w``):

* ``single``: ``pairwise.ensemble_force(method="tiled")`` on one device;
* ``sharded_1``: ``ensemble_force(..., mesh=...)`` on a 1-device mesh (the
  local XLA tiles of ``pairwise.tiled`` inside ``shard_map``, no communication);
* ``allgather_P`` / ``ring_P``: the two strategies on P devices.

On a CPU the P "devices" share the machine's cores, so this measures overhead
(collectives, padding, the per-device programs), not a multi-GPU speed-up:
``ratio`` = time / time of ``single``. Run: ``python benchmarks/bench_sharding.py``
(``--quick`` for a smoke run). Writes results/sharding.{json,md}.
"""

from __future__ import annotations

import os
import sys


def _devices_flag(argv) -> int:
    for i, a in enumerate(argv):
        if a == "--devices" and i + 1 < len(argv):
            return int(argv[i + 1])
        if a.startswith("--devices="):
            return int(a.split("=", 1)[1])
    return 4


# Must happen before JAX creates its CPU backend (i.e. before importing it).
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={_devices_flag(sys.argv)}"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from _common import base_parser, time_call, write_results  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cenlmc_jax.pairwise import ensemble_force, make_mesh  # noqa: E402


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
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=4, help="forced CPU devices (read before JAX starts)")
    parser.add_argument("--sizes", default="1024,4096,16384", help="comma-separated N")
    parser.add_argument("--dim", type=int, default=10)
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
            f"allgather_{p}": lambda: ensemble_force(*a, mesh=mesh_p, strategy="allgather", **kw),
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
            diff = float(np.max(np.abs(np.asarray(res.force_sum) - ref)) / max(np.max(np.abs(ref)), 1e-30))
            row = dict(
                N=n, d=args.dim, variant=name, median_s=t.median_s, first_call_s=t.first_call_s,
                ratio=t.median_s / base, pairs_per_s=f"{n * n / t.median_s:.3g}", max_rel_diff_vs_single=diff,
            )  # fmt: skip
            rows.append(row)
            print(row, flush=True)
    write_results(
        "sharding", {"args": {k: str(v) for k, v in vars(args).items()}, "num_devices": p}, rows,
        out_dir=args.out_dir, title=f"Sharded ensemble force on {p} forced CPU devices vs one device",
        columns=["N", "d", "variant", "median_s", "ratio", "pairs_per_s", "first_call_s", "max_rel_diff_vs_single"],
        notes=[
            f"The {p} devices are XLA CPU devices forced on one machine: they share its "
            f"{os.cpu_count()} cores, so ratios measure overhead, not a multi-device speed-up.",
            "ratio = median time / median time of `single` (pairwise.ensemble_force, method='tiled').",
            "max_rel_diff_vs_single: max |force - single| / max |single| (float32 summation order).",
            "Timings on a shared, loaded machine are noisy: rerun on a quiet one.",
        ],
    )  # fmt: skip


if __name__ == "__main__":
    main()
