"""What ``mesh=`` promises for a whole run (issue "nothing lost": same samples, or an
honest claim; docs/guide/checkpoints.md, "Sharding").

On 4 forced CPU devices (a subprocess: the device count is fixed when JAX
starts), CEnLMC with ``mesh=`` against the plain call with the same key, over
200 steps:

* ``strategy="allgather"``: every device prepares the gathered ensemble as one
  device would and sums each row in the same order, so the run is the same
  run, bit for bit;
* ``strategy="ring"``: the partial sums arrive in another order, so each step
  equals the single-device one only to rounding (~1e-6 relative), and over
  many steps a rounding difference flips a borderline mask decision and the
  trajectories decorrelate. The claim is then equality in distribution: the
  long-run moments of the two runs agree within their Monte-Carlo error.

In general (issue 47: N = 64, 256, 2,048 on 2 devices, CEnLMC and EnLMC) the
promise is equality up to floating-point reduction order, not bit for bit: the
first step is the same (every particle takes its true gradient), and the traces
of the first 10 steps agree to within 2e-5 (float32) and 5e-14 (float64) on a
unit-scale target (:func:`test_mesh_runs_agree_to_rounding`).
"""

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import jax, jax.numpy as jnp
    import cenlmc_jax as cj
    from cenlmc_jax.pairwise import make_mesh

    tgt = cj.models.targets.standard_gaussian(2)
    x0 = jax.random.normal(jax.random.key(0), (400, 2))
    out = {"num_devices": np.array(len(jax.devices()))}
    for tag, mesh, strategy in (("single", None, "allgather"),
                                ("allgather", make_mesh(4), "allgather"),
                                ("ring", make_mesh(4), "ring")):
        algo = cj.cenlmc(tgt.logdensity_fn, 0.05, 0.4, 0.5, 0.4, 5, 10.0,
                         f_star=tgt.f_star, mesh=mesh, strategy=strategy)
        res = cj.sample(jax.random.key(1), algo, algo.init(x0), 200, burn_in=20,
                        trace_fn=lambda s: jnp.concatenate(
                            [s.position, s.position ** 2], axis=-1))
        out[tag + "/trace"] = np.asarray(res.trace)
        out[tag + "/fraction"] = np.asarray(res.info.ensemble_fraction)
    np.savez(sys.argv[1], **out)
    """
)


def test_allgather_is_the_same_run_and_ring_the_same_distribution(tmp_path):
    path = tmp_path / "runs.npz"
    env = dict(
        os.environ,
        XLA_FLAGS="--xla_force_host_platform_device_count=4",
        JAX_PLATFORMS="cpu",
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = np.load(path)
    assert int(out["num_devices"]) == 4
    assert (
        np.mean(out["single/fraction"][20:]) > 0.3
    )  # the ensemble force is really in use
    np.testing.assert_array_equal(
        out["allgather/trace"], out["single/trace"]
    )  # the same run, bit for bit

    def per_particle(
        trace,
    ):  # (draws, N, 4) -> grand means of (x, x²) and their MCSEs over the N particles
        per = trace.astype(np.float64).mean(axis=0)
        return per.mean(axis=0), per.std(axis=0, ddof=1) / math.sqrt(per.shape[0])

    m_single, se_single = per_particle(out["single/trace"])
    m_ring, se_ring = per_particle(out["ring/trace"])
    z = (m_ring - m_single) / np.hypot(se_single, se_ring)
    # the runs share their key, which correlates them positively at first: the
    # difference's variance is below se1² + se2², so this z-test is conservative; 4
    # sigma: false alarm < 1e-4 per moment
    assert np.all(np.abs(z) < 4.0), z


ROUNDING_SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import jax, jax.numpy as jnp
    import cenlmc_jax as cj
    from cenlmc_jax.pairwise import make_mesh

    name, dtype = sys.argv[2], sys.argv[3]
    out = {"num_devices": np.array(len(jax.devices()))}
    with jax.enable_x64(dtype == "float64"):
        logdensity = lambda x: -0.5 * jnp.sum(x**2)
        x0 = jax.random.normal(jax.random.key(0), (64, 2), dtype)
        for tag, mesh in (("single", None), ("mesh", make_mesh(2))):
            if name == "cenlmc":
                algo = cj.cenlmc(logdensity, 0.05, 0.4, 0.5, 0.4, 5, 10.0,
                                 f_star=0.0, mesh=mesh)
            else:
                algo = cj.enlmc(logdensity, 0.05, 0.4, mesh=mesh)
            # EnLMC at N = 64 is flagged unstable (its drift deficit, Theorem
            # 3.2) from step 5: on_divergence="warn" keeps the 10 steps
            res = cj.sample(jax.random.key(1), algo, algo.init(x0), 10,
                            check_convergence=False, on_divergence="warn")
            out[tag] = np.asarray(res.trace)
            out[tag + "/fraction"] = np.asarray(
                getattr(res.info, "ensemble_fraction", np.ones(10)))
    np.savez(sys.argv[1], **out)
    """
)

# the documented bound on the first 10 steps' traces (unit-scale positions), about 3x
# the largest difference measured (2 forced CPU devices, jax 0.10, N = 64, 256, 2,048,
# CEnLMC and EnLMC: float32 6.8e-6 (EnLMC, N = 2,048), float64 1.2e-14): rounding of
# the same sums in another order compounds over the steps; N = 64 is tested here (the
# sharded run folds tiles where one device takes the dense pair sums, N <= 64), the
# larger N measured only (a compilation at N = 2,048 takes ~7 s a run)
ROUNDING_BOUND = {"float32": 2e-5, "float64": 5e-14}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", ["cenlmc", "enlmc"])
def test_mesh_runs_agree_to_rounding(name, dtype, tmp_path):
    path = tmp_path / "runs.npz"
    env = dict(
        os.environ,
        XLA_FLAGS="--xla_force_host_platform_device_count=2",
        JAX_PLATFORMS="cpu",
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    proc = subprocess.run(
        [sys.executable, "-c", ROUNDING_SCRIPT, str(path), name, dtype],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = np.load(path)
    assert int(out["num_devices"]) == 2
    single, mesh = out["single"], out["mesh"]
    assert single.dtype == mesh.dtype == np.dtype(dtype) and single.shape == (10, 64, 2)
    # the ensemble force is in use after the first step (else there is nothing to test)
    assert np.mean(out["single/fraction"][1:]) > 0.05
    # the first step: every particle's true gradient, the same numbers
    np.testing.assert_array_equal(mesh[0], single[0])
    diff = np.abs(mesh.astype(np.float64) - single.astype(np.float64))
    assert float(diff.max()) <= ROUNDING_BOUND[dtype], diff.max(axis=(1, 2))


def test_the_guide_states_the_tested_guarantee():
    # issue 47: the guide said "the same run, bit for bit, when N is a multiple of the
    # device count", which N = 64, 256, 2,048 contradicted; it now states the bound
    # tested above, and these must not drift apart
    guide = " ".join((ROOT / "docs" / "guide" / "checkpoints.md").read_text().split())
    assert "bit for bit, when N is a multiple of the device count" not in guide
    f32, f64 = (f"{ROUNDING_BOUND[t]:.0e}".replace("e-0", "e-") for t in ROUNDING_BOUND)
    assert (
        f"the first 10 steps agree to within {f32} in float32 and {f64} in float64"
        in guide
    ), (f32, f64)
    assert "the first step is the same, bit for bit" in guide
