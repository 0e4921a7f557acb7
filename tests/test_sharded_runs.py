"""What ``mesh=`` promises for a whole run (issue "nothing lost": same samples, or an
honest claim).

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
"""

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

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
