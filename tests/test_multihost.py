"""Several processes (``jax.distributed``): 2 processes x 2 CPU devices on 127.0.0.1,
gloo collectives.

One sharded CEnLMC run over all 4 devices; then everything that brings a result
to the host (``cj.summary``, ``cj.to_arviz``, ``cj.to_host``, a checkpoint and reading
it back, the checks of a sharded starting ensemble, the end-of-run convergence check)
must work on every process and agree
with one process running the same job on 4 local devices (the sharded step is
the same program, so the draws are equal to rounding; measured bitwise).
Before: each raised "Fetching value for jax.Array that spans non-addressable
devices", and every process wrote the same checkpoint file.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

WORKER = textwrap.dedent(
    """
    import json, os, sys, warnings
    import numpy as np
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    pid, nproc, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    if nproc > 1:
        jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc,
                                   process_id=pid)
    import cenlmc_jax as cj
    from cenlmc_jax.pairwise import make_mesh, shard_ensemble

    mesh = make_mesh()
    assert len(mesh.devices.ravel()) == 4, mesh
    t = cj.models.targets.standard_gaussian(2)
    x0 = np.asarray(jax.random.normal(jax.random.key(1), (64, 2)))
    algo = cj.cenlmc(t.logdensity_fn, 0.05, 0.6, 0.45, 0.6, 3, 20.0, mesh=mesh)
    # the checks of a sharded ensemble pull it to the host
    state = algo.init(shard_ensemble(x0, mesh))
    ck = os.path.join(out, "run.ck")
    kw = dict(burn_in=5, checkpoint_path=ck, chunk_size=10, check_convergence=False)
    res = cj.sample(jax.random.key(0), algo, state, 20, **kw)
    table = cj.summary(res)
    idata = cj.to_arviz(res)
    # the finished run, read back
    again = cj.sample(jax.random.key(0), algo, state, 20, **kw)
    # every process: the whole run as NumPy arrays
    host, host_again = cj.to_host(res), cj.to_host(again)
    if pid == 0:
        np.savez(os.path.join(out, "result.npz"),
                 trace=np.asarray(cj.diagnostics.chains_first(host)),
                 again=np.asarray(cj.diagnostics.chains_first(host_again)),
                 mean=np.asarray(table.columns["mean"]),
                 posterior=np.asarray(idata.posterior["x"].values))
    print(json.dumps(dict(pid=pid, files=sorted(os.listdir(out)))))
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(tmp_path, name, nproc, devices_per_process):
    out = tmp_path / name
    out.mkdir()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices_per_process}",
    )
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(i), str(nproc), port, str(out)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(nproc)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, se) in zip(procs, outs, strict=True):
        assert p.returncode == 0, se[-4000:]
    return out, [json.loads(so.strip().splitlines()[-1]) for so, _ in outs]


@pytest.mark.timeout(900)
def test_two_processes_summarise_export_checkpoint_and_resume_like_one(tmp_path):
    one, _ = _run(tmp_path, "one", 1, 4)
    two, reports = _run(tmp_path, "two", 2, 2)
    a, b = np.load(one / "result.npz"), np.load(two / "result.npz")
    for field in ("trace", "again", "mean", "posterior"):
        # the same sharded program on the same 4 devices' worth of shards; collectives
        # over gloo instead of in-process: equal to float32 rounding of a few steps
        # (measured: bitwise)
        np.testing.assert_allclose(
            b[field], a[field], rtol=1e-5, atol=1e-6, err_msg=field
        )
    assert np.array_equal(a["again"], a["trace"]) and np.array_equal(
        b["again"], b["trace"]
    )  # read back
    # process 0 alone wrote the checkpoint (one file and its chunk folder) and the
    # result
    assert sorted(os.listdir(two)) == sorted(os.listdir(one))
    assert {r["pid"] for r in reports} == {0, 1}
