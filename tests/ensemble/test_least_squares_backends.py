"""The least-squares fit on every backend of the pair force: Pallas, and sharded over a
mesh.

What cannot be faked: the dense all-pairs fit (tests/ensemble/test_least_squares.py
tests it against exact gradients) is the oracle. The sharded fold runs each row tile's
fold unchanged on the device that owns it, so it must equal the single-device fold bit
for bit (4 forced CPU devices in a subprocess: the device count is fixed when JAX
starts); the Pallas kernel (interpret mode here) sums in another order, so it agrees to
rounding. A CEnLMC step with ``estimator="least_squares"`` under ``method="pallas"`` and
under ``mesh=`` takes the same decisions as the XLA step on one device.
"""

import functools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cenlmc_jax as cj
from cenlmc_jax.ensemble.least_squares import (
    least_squares_dense,
    least_squares_gradient,
)

ROOT = Path(__file__).resolve().parents[2]


def cloud(n, d, seed=0):
    x = jax.random.normal(jax.random.key(seed), (n, d))  # float64 under enable_x64
    f = 0.5 * jnp.sum(x**2, axis=1) + 0.3 * jnp.sin(x[:, 0])
    return x, f


@pytest.mark.parametrize("quadratic", [False, True])
def test_method_pallas_is_the_dense_fit(quadratic):
    with jax.enable_x64(True):
        x, f = cloud(90, 2)
        got = least_squares_gradient(x, f, 0.9, method="pallas", quadratic=quadratic)
        ref = least_squares_dense(x, f, 0.9, quadratic=quadratic)
        np.testing.assert_array_equal(got.ok, ref.ok)
        assert (
            int(np.sum(ref.ok)) > 30
        )  # a third of the 90 fits or more are accepted and compared
        # float64, sums of ~50 terms in another order: ~1e-15 relative; 1e-9 leaves room
        # for the solve
        np.testing.assert_allclose(got.grad, ref.grad, rtol=1e-9, atol=1e-9)


def test_a_mesh_with_a_method_that_cannot_shard_is_refused():
    x, f = cloud(40, 2)
    mesh = cj.pairwise.make_mesh(1)
    for method in ("dense", "pallas"):
        with pytest.raises(ValueError, match="mesh"):
            least_squares_gradient(x, f, 0.9, method=method, mesh=mesh)
    with pytest.raises(ValueError, match="mesh"):
        least_squares_gradient(x, f, 0.9, mesh="cpu")


def test_cenlmc_step_with_the_fit_under_pallas_takes_the_xla_steps_decisions():
    logdensity = lambda x: -0.5 * jnp.sum(x**2)  # noqa: E731
    x0 = jax.random.normal(jax.random.key(0), (128, 2))
    state0 = cj.ensemble.cenlmc_init(x0, logdensity, f_star=0.0)
    kw = dict(
        logdensity_fn=logdensity,
        step_size=0.05,
        eta=0.5,
        r1=0.5,
        r2=0.4,
        n_star=5,
        m_f=10.0,
        estimator="least_squares",
    )
    outs = {}
    for method in ("auto", "pallas"):
        step = jax.jit(functools.partial(cj.ensemble.cenlmc_step, method=method, **kw))
        state, infos = state0, []
        for k in range(3):
            state, info = step(jax.random.fold_in(jax.random.key(1), k), state)
            infos.append(info)
        outs[method] = (state, infos)
    (sa, ia), (sb, ib) = outs["auto"], outs["pallas"]
    for a, b in zip(ia, ib, strict=True):
        assert int(a.grad_evals) == int(b.grad_evals)  # the same particles used the fit
    assert float(ia[-1].ensemble_fraction) > 0.3
    # float32, three steps: the fit's sums in another order move positions by rounding
    # only
    np.testing.assert_allclose(sa.position, sb.position, rtol=1e-4, atol=1e-4)


SCRIPT = textwrap.dedent(
    """
    import functools, sys
    import numpy as np
    import jax, jax.numpy as jnp
    import cenlmc_jax as cj
    from cenlmc_jax.ensemble.least_squares import (
        least_squares_sparse, least_squares_tiled)
    from cenlmc_jax.pairwise import make_mesh

    jax.config.update("jax_enable_x64", True)
    mesh = make_mesh(4)
    out = {"num_devices": np.array(len(jax.devices()))}
    # 403: the row tiles do not split evenly, invalid tiles pad the last device
    for n in (400, 403):
        x = jax.random.normal(jax.random.key(n), (n, 2), jnp.float64)
        f = 0.5 * jnp.sum(x ** 2, axis=1) + 0.3 * jnp.sin(x[:, 0])
        for name, fn in (("tiled", least_squares_tiled),
                         ("sparse", least_squares_sparse)):
            for tag, m in (("single", None), ("mesh", mesh)):
                res = fn(x, f, 0.6, block_size=32, mesh=m)
                out[f"{n}/{name}/{tag}/grad"] = np.asarray(res.grad)
                out[f"{n}/{name}/{tag}/ok"] = np.asarray(res.ok)
    logdensity = lambda x: -0.5 * jnp.sum(x ** 2)
    x0 = jax.random.normal(jax.random.key(0), (400, 2), jnp.float32)
    state0 = cj.ensemble.cenlmc_init(x0, logdensity, f_star=0.0)
    for tag, m in (("single", None), ("mesh", mesh)):
        step = jax.jit(functools.partial(
            cj.ensemble.cenlmc_step, logdensity_fn=logdensity, step_size=0.05, eta=0.4,
            r1=0.5, r2=0.4, n_star=5, m_f=10.0, mesh=m, estimator="least_squares"))
        state = state0
        for k in range(5):
            state, info = step(jax.random.fold_in(jax.random.key(1), k), state)
        out[f"chain/{tag}/position"] = np.asarray(state.position)
        out[f"chain/{tag}/fraction"] = np.asarray(info.ensemble_fraction)
    np.savez(sys.argv[1], **out)
    """
)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    path = tmp_path_factory.mktemp("ls_sharded") / "out.npz"
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
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(np.load(path))


@pytest.mark.parametrize("n", [400, 403])
@pytest.mark.parametrize("name", ["tiled", "sparse"])
def test_the_sharded_fit_is_the_single_device_fit_bit_for_bit(sharded, name, n):
    assert int(sharded["num_devices"]) == 4
    # each device folds its row tiles against the same column tiles in the same order:
    # identical sums
    np.testing.assert_array_equal(
        sharded[f"{n}/{name}/mesh/grad"], sharded[f"{n}/{name}/single/grad"]
    )
    np.testing.assert_array_equal(
        sharded[f"{n}/{name}/mesh/ok"], sharded[f"{n}/{name}/single/ok"]
    )
    assert (
        sharded[f"{n}/{name}/single/ok"].mean() > 0.5
    )  # the comparison covers accepted fits


def test_a_sharded_cenlmc_chain_with_the_fit_follows_the_single_device_chain(sharded):
    assert float(sharded["chain/single/fraction"]) > 0.3  # the fit was used
    assert float(sharded["chain/mesh/fraction"]) == float(
        sharded["chain/single/fraction"]
    )
    # the pair force's all-gather and the fit are exact re-layouts; 5 float32 steps stay
    # within rounding
    np.testing.assert_allclose(
        sharded["chain/mesh/position"],
        sharded["chain/single/position"],
        rtol=1e-5,
        atol=1e-5,
    )
