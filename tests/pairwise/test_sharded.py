"""The sharded ensemble force (cenlmc_jax/pairwise/sharded.py) on 4 forced CPU devices,
against a float64 oracle.

``--xla_force_host_platform_device_count`` only acts before JAX creates its
CPU backend, and by the time this file runs other tests have created it with
one device. The sharded computations therefore run in a subprocess with the
flag set (one subprocess for the whole file, module fixture); it saves its
results, and the comparisons happen here against ``oracle_with_bound`` of
``test_pairwise_pallas`` (float64 direct differences plus a pair-by-pair
first-order rounding-error bound, explained in that file's docstring).

Sharded and single-device results are both within that bound of the exact
sums, so they must agree within twice the bound: the strategies only change
the order of the float32 summation (and, for the ring, the psum'ed centre), never which
pairs are summed, except pairs that sit within rounding error of a mask edge,
which the bound includes.

The local partial is the XLA tile fold (``tiled_partial``, injected with
row and column blocks that split the columns into several tiles) or, through
``ensemble_force(..., mesh=...)``, whatever ``method`` and ``precision`` ask for.
"""

from __future__ import annotations

import functools
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from test_pallas import EPS32, cenlmc_like_inputs, oracle_with_bound

from cenlmc_jax.pairwise import (
    DIRECT_MAX_D,
    coincident_rtol,
    ensemble_force,
    ensemble_force_sharded,
    make_mesh,
    shard_ensemble,
)
from cenlmc_jax.pairwise.tiled import tiled_partial

ROOT = Path(__file__).resolve().parents[2]
NUM_DEVICES = 4

# name: (seed, n, d, with w, strategy, local). n is not a multiple of 4
# except in "even"; d = 1 takes the XLA tile's exact-difference branch.
CASES = {
    "allgather_d3_w": (0, 333, 3, True, "allgather", "xla"),
    "ring_d3_w": (0, 333, 3, True, "ring", "xla"),
    "ring_d10": (1, 250, 10, False, "ring", "xla"),
    "allgather_d1": (2, 201, 1, False, "allgather", "xla"),
    "ring_pallas_d3_w": (0, 333, 3, True, "ring", "pallas"),
    "even_allgather_d3_w": (3, 332, 3, True, "allgather", "xla"),
}
# ensemble_force(..., mesh=mesh, **how) on the "honour_d5_w" ensemble (seed 4,
# n = 333, d = 5: Gram distances, whose coincidence bound the precision sets).
HONOUR_CASE = (4, 333, 5)
HONOUR = {
    "pallas_default": dict(method="pallas", precision="default", strategy="ring"),
    "tiled_default": dict(method="tiled", precision="default"),
    "auto_highest": dict(method="auto"),
}

SCRIPT = textwrap.dedent(
    """
    import functools
    import sys
    import numpy as np
    import jax
    from cenlmc_jax.pairwise import (
        ensemble_force, ensemble_force_sharded, make_mesh, shard_ensemble)
    from cenlmc_jax.pairwise.tiled import tiled_partial

    data = dict(np.load(sys.argv[1], allow_pickle=True))
    HONOUR = data["honour"].item()
    out = {"num_devices": np.array(len(jax.devices()))}
    mesh = make_mesh(4)
    for name, spec in data["cases"].item().items():
        seed, n, d, with_w, strategy, local = spec
        x, f, log_p = data[name + "/x"], data[name + "/f"], data[name + "/log_p"]
        eta = float(data[name + "/eta"])
        kw = dict(w=data[name + "/w"], r2=float(data[name + "/r2"])) if with_w else {}
        if local == "xla":  # the XLA tile fold, several column tiles per device
            local_fn = functools.partial(tiled_partial, block_rows=32, block_cols=48)
            res = ensemble_force_sharded(x, f, log_p, eta, partial_fn=local_fn,
                                         mesh=mesh, strategy=strategy, **kw)
        else:
            res = ensemble_force(x, f, log_p, eta, mesh=mesh, strategy=strategy,
                                 method=local, **kw)
        tiled = ensemble_force(x, f, log_p, eta, method="tiled", **kw)
        for tag, r in (("sharded", res), ("tiled", tiled)):
            for field in r._fields:
                out[f"{name}/{tag}/{field}"] = np.asarray(getattr(r, field))
        out[name + "/spec"] = np.array(str(res.force_sum.sharding.spec))
        out[name + "/devices"] = np.array(len(res.force_sum.sharding.device_set))
    # an ensemble placed with shard_ensemble goes through a jitted caller
    name = "even_allgather_d3_w"
    x = shard_ensemble(data[name + "/x"], mesh)
    f = shard_ensemble(data[name + "/f"], mesh)
    log_p = shard_ensemble(data[name + "/log_p"], mesh)
    jitted = jax.jit(
        lambda x, f, lp: ensemble_force(x, f, lp, float(data[name + "/eta"]),
                                        mesh=mesh))
    r = jitted(x, f, log_p)
    out["jit/force_sum"] = np.asarray(r.force_sum)
    out["jit/spec"] = np.array(str(r.force_sum.sharding.spec))
    # method and precision reach the local partials of ensemble_force(..., mesh=...)
    name = "honour_d5_w"
    x, f, log_p, eta = (data[name + "/x"], data[name + "/f"], data[name + "/log_p"],
                        float(data[name + "/eta"]))
    kw = dict(w=data[name + "/w"], r2=float(data[name + "/r2"]))
    for tag, how in HONOUR.items():
        call = functools.partial(ensemble_force, eta=eta, mesh=mesh, **how, **kw)
        r = call(x, f, log_p)
        for field in r._fields:
            out[f"{name}/{tag}/{field}"] = np.asarray(getattr(r, field))
        out[f"{name}/{tag}/pallas_call"] = np.array(
            "pallas_call" in str(jax.make_jaxpr(call)(x, f, log_p)))
    np.savez(sys.argv[2], **out)
    """
)


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sharding")
    inputs = {
        "cases": np.array(CASES, dtype=object),
        "honour": np.array(HONOUR, dtype=object),
    }
    ensembles = {
        name: (seed, n, d, with_w) for name, (seed, n, d, with_w, _, _) in CASES.items()
    }
    ensembles["honour_d5_w"] = HONOUR_CASE + (True,)
    for name, (seed, n, d, with_w) in ensembles.items():
        x, f, log_p, eta, w, r2 = cenlmc_like_inputs(seed, n, d)
        inputs.update(
            {f"{name}/x": x, f"{name}/f": f, f"{name}/log_p": log_p, f"{name}/eta": eta}
        )
        if with_w:
            inputs.update({f"{name}/w": w, f"{name}/r2": r2})
    np.savez(tmp / "in.npz", **inputs)
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "")
        + f" --xla_force_host_platform_device_count={NUM_DEVICES}"
    ).strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp / "in.npz"), str(tmp / "out.npz")],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return dict(np.load(tmp / "out.npz")), dict(
        np.load(tmp / "in.npz", allow_pickle=True)
    )


def _reference(inputs, name, gram=None):
    """Oracle and bound; ``gram`` (default: as the case's local computation) picks the
    bound."""
    seed, n, d, with_w, strategy, local = CASES[name]
    kw = dict(w=inputs[name + "/w"], r2=float(inputs[name + "/r2"])) if with_w else {}
    args = (
        inputs[name + "/x"],
        inputs[name + "/f"],
        inputs[name + "/log_p"],
        float(inputs[name + "/eta"]),
    )
    if gram is None:
        # both local computations use the Gram identity for d > DIRECT_MAX_D
        # and exact differences below: each case is held to its own bound
        gram = d > DIRECT_MAX_D
    return oracle_with_bound(
        *args, gram=gram, coincident_rtol=coincident_rtol(d, np.float32), **kw
    )


def test_runs_on_four_devices(sharded_run):
    out, _ = sharded_run
    assert int(out["num_devices"]) == NUM_DEVICES
    for name in CASES:
        assert int(out[name + "/devices"]) == NUM_DEVICES, name


@pytest.mark.parametrize("name", list(CASES))
def test_sharded_matches_float64_oracle(sharded_run, name):
    out, inputs = sharded_run
    ref = _reference(inputs, name)
    force = out[f"{name}/sharded/force_sum"].astype(np.float64)
    assert force.shape == ref["force"].shape and np.all(np.isfinite(force))
    assert ref["n_ball"].mean() > 2  # masks select pairs: not a vacuous comparison
    err = np.max(np.abs(force - ref["force"]), axis=1)
    assert np.all(err <= ref["bound"]), f"max excess {np.max(err - ref['bound']):.3e}"
    for field in ("n_r2", "n_ball"):
        got = out[f"{name}/sharded/{field}"]
        assert np.all(np.abs(got - ref[field]) <= ref["ambiguous"]), field


@pytest.mark.parametrize("name", list(CASES))
def test_sharded_equals_single_device(sharded_run, name):
    # The single-device force is ensemble_force(method="tiled"). Same
    # pairs, other summation order: each result is within its own bound of
    # the exact sums, so they differ by at most the sum of the two bounds.
    out, inputs = sharded_run
    ref = _reference(inputs, name)
    d = CASES[name][2]
    bound_tiled = _reference(inputs, name, gram=d > DIRECT_MAX_D)[
        "bound"
    ]  # method="tiled"
    a = out[f"{name}/sharded/force_sum"].astype(np.float64)
    b = out[f"{name}/tiled/force_sum"].astype(np.float64)
    assert np.all(np.max(np.abs(a - b), axis=1) <= ref["bound"] + bound_tiled)
    for field in ("n_r2", "n_ball"):
        diff = np.abs(out[f"{name}/sharded/{field}"] - out[f"{name}/tiled/{field}"])
        assert np.all(diff <= ref["ambiguous"]), field


def test_result_stays_sharded_when_n_divides(sharded_run):
    out, _ = sharded_run
    assert str(out["even_allgather_d3_w/spec"]).startswith("P('particles'")
    assert str(out["jit/spec"]).startswith("P('particles'")


def test_jitted_call_on_sharded_inputs(sharded_run):
    out, inputs = sharded_run
    name = "even_allgather_d3_w"
    args = (
        inputs[name + "/x"],
        inputs[name + "/f"],
        inputs[name + "/log_p"],
        float(inputs[name + "/eta"]),
    )
    ref = oracle_with_bound(
        *args, gram=True, coincident_rtol=coincident_rtol(3, np.float32)
    )
    err = np.max(np.abs(out["jit/force_sum"].astype(np.float64) - ref["force"]), axis=1)
    assert np.all(err <= ref["bound"])


def _floor_band_terms(x, f, log_p, eta, w, r2, kappa, eps=EPS32):
    """Per row, Σ |W_ij| |x_j - x_i| over the pairs (in both masks) whose Gram d² lies
    within the identity's rounding error, 2 (2d + 4) ε t_ij, of the coincidence
    floor κ t_ij: float32 code may put them on either side (float64, centred as
    the kernels centre)."""
    x, f, log_p, w = (np.asarray(a, np.float64) for a in (x, f, log_p, w))
    n, d = x.shape
    xc, wc = x - x.mean(axis=0), w - w.mean(axis=0)
    sq = np.sum(xc * xc, axis=1)
    t = sq[:, None] + sq[None, :]
    d2 = np.sum((xc[None] - xc[:, None]) ** 2, axis=-1)
    dw2 = np.sum((wc[None] - wc[:, None]) ** 2, axis=-1)
    pair = (d2 <= eta * eta) & (dw2 <= r2 * r2) & ~np.eye(n, dtype=bool)
    band = pair & (np.abs(d2 - kappa * t) <= 2 * (2 * d + 4) * eps * t)
    log_alpha = math.log(d) - (
        0.5 * d * math.log(math.pi) + d * math.log(eta) - math.lgamma(0.5 * d + 1)
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        term = (
            np.exp(log_alpha - log_p)[None, :]
            * np.abs(f[None, :] - f[:, None])
            / np.sqrt(d2)
        )
    return np.where(band, term, 0.0).sum(axis=1)


def test_mesh_honours_method_and_precision(sharded_run):
    """ensemble_force(..., mesh=mesh) runs the local partial of ``method`` with
    ``precision``: method="pallas" puts a pallas_call into the program and the
    others do not; precision="default" widens the Gram coincidence bound
    (κ = (2d+4)·2^-7 instead of (2d+4)·2^-24), which drops many close pairs
    from the force. So with precision="default" the sharded results (Pallas on
    a ring, XLA tiles all-gathered) must equal the single-device tiled result
    at "default" -- within two rounding bounds plus the pairs at the wider
    floor -- while that result is far from the one at HIGHEST."""
    out, inputs = sharded_run
    name = "honour_d5_w"
    seed, n, d = HONOUR_CASE
    x, f, log_p = inputs[name + "/x"], inputs[name + "/f"], inputs[name + "/log_p"]
    eta, w, r2 = (
        float(inputs[name + "/eta"]),
        inputs[name + "/w"],
        float(inputs[name + "/r2"]),
    )
    assert [bool(out[f"{name}/{tag}/pallas_call"]) for tag in HONOUR] == [
        True,
        False,
        False,
    ]

    highest = ensemble_force(x, f, log_p, eta, w=w, r2=r2, method="tiled")
    default = ensemble_force(
        x, f, log_p, eta, w=w, r2=r2, method="tiled", precision="default"
    )
    ref = oracle_with_bound(
        x,
        f,
        log_p,
        eta,
        w=w,
        r2=r2,
        gram=True,
        coincident_rtol=coincident_rtol(d, np.float32),
    )
    band = _floor_band_terms(
        x, f, log_p, eta, w, r2, coincident_rtol(d, np.float32, "default")
    )
    allowed = 2 * ref["bound"] + band
    single = np.asarray(default.force_sum, np.float64)
    for tag in ("pallas_default", "tiled_default"):
        got = out[f"{name}/{tag}/force_sum"].astype(np.float64)
        assert np.all(np.max(np.abs(got - single), axis=1) <= allowed), tag
        for field in ("n_r2", "n_ball"):
            diff = np.abs(
                out[f"{name}/{tag}/{field}"] - np.asarray(getattr(default, field))
            )
            assert np.all(diff <= ref["ambiguous"]), (tag, field)
    # Non-vacuous: at "default" most rows lose pairs, far beyond what the comparison
    # allows.
    moved = (
        np.max(np.abs(single - np.asarray(highest.force_sum, np.float64)), axis=1)
        > allowed
    )
    has = ref["n_ball"] > 0
    assert moved[has].mean() > 0.5, moved[has].mean()
    # And "auto" with a mesh is the XLA path at HIGHEST: within the bound of the oracle.
    got = out[f"{name}/auto_highest/force_sum"].astype(np.float64)
    assert np.all(np.max(np.abs(got - ref["force"]), axis=1) <= ref["bound"])


def test_bad_arguments_raise():
    x = np.zeros((8, 2), np.float32)
    z = np.zeros(8, np.float32)
    with pytest.raises(ValueError, match="strategy must be one of"):
        ensemble_force(x, z, z, 1.0, mesh=make_mesh(1), strategy="tree")
    with pytest.raises(ValueError, match="method must be one of"):
        ensemble_force(x, z, z, 1.0, mesh=make_mesh(1), method="cuda")
    with pytest.raises(
        ValueError, match="method must be 'auto', 'tiled' or 'pallas' with a mesh"
    ):
        ensemble_force(x, z, z, 1.0, mesh=make_mesh(1), method="dense")
    with pytest.raises(ValueError, match="partial_fn must be a callable"):
        ensemble_force_sharded(x, z, z, 1.0, partial_fn=None, mesh=make_mesh(1))
    with pytest.raises(ValueError, match="axis_name 'rows' is not an axis"):
        ensemble_force_sharded(
            x, z, z, 1.0, partial_fn=tiled_partial, mesh=make_mesh(1), axis_name="rows"
        )
    with pytest.raises(ValueError, match="num_devices must be an integer"):
        make_mesh(10**6)
    with pytest.raises(ValueError, match="leading particle axis"):
        shard_ensemble(np.zeros(()), make_mesh(1))


@pytest.mark.parametrize(
    "d", [2, 3]
)  # exact-difference and Gram branches of the XLA tiles
def test_one_device_xla_tiles_nonfinite_rows_and_huge_weight(d):
    # The local XLA tile loop, run in this process on a 1-device mesh: rows
    # with NaN/inf inputs contribute nothing, and one particle with a weight
    # beyond the float32 range (log p = -150) leaves the rows that do not see
    # it untouched (the per-row rescale), while its neighbours come out inf.
    x, f, log_p, eta, w, r2 = cenlmc_like_inputs(6, 150, d)
    x[3] = np.nan
    f[5] = np.inf
    w[9, 0] = np.inf
    near = np.sum((x[:, None] - x[None]) ** 2, axis=-1) <= eta * eta
    np.fill_diagonal(near, False)
    heavy = int(np.argmax(np.where(np.isfinite(near.sum(1)), near.sum(1), -1)))
    log_p[heavy] = -150.0
    local = functools.partial(tiled_partial, block_rows=32, block_cols=48)
    res = ensemble_force_sharded(
        x, f, log_p, eta, partial_fn=local, w=w, r2=r2, mesh=make_mesh(1)
    )
    ref = oracle_with_bound(
        x, f, log_p, eta, w=w, r2=r2, gram=d > DIRECT_MAX_D,
        coincident_rtol=coincident_rtol(d, np.float32),
    )  # fmt: skip
    force = np.asarray(res.force_sum, np.float64)
    assert not np.any(np.isnan(force))
    huge = np.max(np.abs(ref["force"]), axis=1) > np.finfo(np.float32).max
    assert huge.sum() >= 1 and np.all(np.isinf(force[huge]).any(axis=1))
    ok = ~huge
    assert np.all(
        np.max(np.abs(force[ok] - ref["force"][ok]), axis=1) <= ref["bound"][ok]
    )
    assert np.all(force[[3, 5, 9]] == 0)
    for field in ("n_r2", "n_ball"):
        assert np.all(
            np.abs(np.asarray(getattr(res, field)) - ref[field]) <= ref["ambiguous"]
        ), field


CENLMC_SCRIPT = textwrap.dedent(
    """
    import functools, sys
    import numpy as np
    import jax
    import cenlmc_jax as cj
    from cenlmc_jax.pairwise import make_mesh

    tgt = cj.models.targets.standard_gaussian(2)
    x0 = jax.random.normal(jax.random.key(0), (400, 2))
    mesh = make_mesh(4)
    out = {"num_devices": np.array(len(jax.devices()))}
    for tag, m in (("single", None), ("sharded", mesh)):
        state = cj.ensemble.cenlmc_init(x0, tgt.logdensity_fn, f_star=tgt.f_star)
        step = functools.partial(cj.ensemble.cenlmc_step,
                                 logdensity_fn=tgt.logdensity_fn, step_size=0.05,
                                 eta=0.4, r1=0.5, r2=0.4, n_star=5, m_f=10.0, mesh=m)
        res = cj.sample(jax.random.key(1), step, state, 30, thin=30)
        out[tag + "/position"] = np.asarray(res.state.position)
        out[tag + "/fraction"] = np.asarray(res.info.ensemble_fraction)
    np.savez(sys.argv[1], **out)
    """
)


def test_same_cenlmc_step_call_runs_sharded_with_the_same_samples(tmp_path):
    """cenlmc_step(..., mesh=mesh) on 4 forced CPU devices vs the plain call, same
    key."""
    path = tmp_path / "cenlmc.npz"
    env = dict(
        os.environ,
        XLA_FLAGS="--xla_force_host_platform_device_count=4",
        JAX_PLATFORMS="cpu",
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    proc = subprocess.run(
        [sys.executable, "-c", CENLMC_SCRIPT, str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = np.load(path)
    assert int(out["num_devices"]) == NUM_DEVICES
    assert (
        np.mean(out["single/fraction"][10:]) > 0.2
    )  # the ensemble force is really in use
    # The all-gather prepares and sums each row as one device does (measured
    # identical here); should XLA ever order a sum differently (~1e-6 relative
    # per step), a particle whose constraint test sits within that of its
    # threshold could take the other branch, so allow 1% of particles to
    # differ and require the rest to agree to 1e-4.
    diff = np.max(np.abs(out["single/position"] - out["sharded/position"]), axis=1)
    assert np.mean(diff < 1e-4) >= 0.99, np.sort(diff)[-10:]


SPARSE_SCRIPT = textwrap.dedent(
    """
    import functools, sys
    import numpy as np
    import jax
    sys.path.insert(0, sys.argv[2])
    from test_pallas import cenlmc_like_inputs
    import cenlmc_jax as cj
    from cenlmc_jax.pairwise import ensemble_force, make_mesh
    from cenlmc_jax.pairwise.algebra import column_weights, prepare, tile_spec
    from cenlmc_jax.pairwise.sparsity import sort_spatially
    from cenlmc_jax.pairwise.tiled import sparse_capacity, sparse_plan, sparse_tiles

    mesh = make_mesh(4)
    out = {"num_devices": np.array(len(jax.devices()))}

    def device_plans(tag, x, f, log_p, eta, w, r2):
        # the tile lists as the sharded call builds them (each device's rows against
        # all sorted columns, sparse when they hold together at most the single
        # device's capacity) and the single device's list
        n, d = x.shape
        p = prepare(*(jax.numpy.asarray(a) for a in (x, f, log_p)), eta,
                    jax.numpy.asarray(w), r2)
        _, p = sort_spatially(p)
        spec = tile_spec(d, p.x.dtype)
        rows = n // 4
        br, bc = sparse_tiles(rows, n, None, None)
        capacity = sparse_capacity(n, br, bc)
        lengths = [int(sparse_plan(jax.tree.map(lambda a: a[k * rows:(k + 1) * rows],
                                                p),
                                   br, bc, capacity, spec, cols=p).n_pairs)
                   for k in range(4)]
        out[f"{tag}/lengths"] = np.array(lengths)
        out[f"{tag}/single_length"] = np.array(
            int(sparse_plan(p, br, bc, capacity, spec).n_pairs))
        out[f"{tag}/capacity"] = np.array(capacity)
        out[f"{tag}/shared"] = np.array(bool(column_weights(p, spec).shared))
        out[f"{tag}/tile_pairs"] = np.array(4 * -(-rows // br) * -(-n // bc))

    # 2000: 500 rows a device, not a multiple of the 64-row tiles
    for n, d in ((2048, 2), (2000, 2)):
        x, f, log_p, _, w, _ = cenlmc_like_inputs(0, n, d)
        # sqrt(h d), as in benchmarks/bench_sparse.py
        eta = r2 = float(np.sqrt(0.05 * d))
        for tag, kw in (("mesh", dict(mesh=mesh)), ("single", dict(method="tiled")),
                        ("dense", dict(method="tiled", block_sparse=False))):
            kw.setdefault("block_sparse", True)
            r = ensemble_force(x, f, log_p, eta, w=w, r2=r2, **kw)
            for field in r._fields:
                out[f"{n}/{tag}/{field}"] = np.asarray(getattr(r, field))
        device_plans(str(n), x, f, log_p, eta, w, r2)
    # a CEnLMC run with block-sparse sums on the mesh and on one device, same key
    tgt = cj.models.targets.standard_gaussian(2)
    x0 = jax.random.normal(jax.random.key(0), (1024, 2))
    for tag, m in (("single", None), ("mesh", mesh)):
        step = functools.partial(cj.ensemble.cenlmc_step,
                                 logdensity_fn=tgt.logdensity_fn, step_size=0.05,
                                 eta=0.3, r1=0.5, r2=0.3, n_star=5, m_f=10.0, mesh=m,
                                 block_sparse=True, method="tiled")
        res = cj.sample(
            jax.random.key(1), step,
            cj.ensemble.cenlmc_init(x0, tgt.logdensity_fn, f_star=tgt.f_star),
            20, thin=20, check_convergence=False)
        out[f"run/{tag}/position"] = np.asarray(res.state.position)
        out[f"run/{tag}/fraction"] = np.asarray(res.info.ensemble_fraction)
    # the plans at the run's last state (its steady state): the sparse fold runs there
    st = res.state
    device_plans("run",
                 *(np.asarray(a) for a in (st.position, -st.logdensity, st.log_p)),
                 0.3, np.asarray(st.w), 0.3)
    np.savez(sys.argv[1], **out)
    """
)


def test_block_sparse_on_a_mesh_equals_one_device(tmp_path):
    """ensemble_force(..., mesh=mesh, block_sparse=True) on 4 forced CPU devices: the
    global Hilbert sort, then each device's run of rows against all sorted columns with
    its own tile list. Every device's list fits (the lists hold together a quarter of
    the tile pairs here, 42% in the run: the sparse fold, not the dense fall-back, ran;
    with 512 rows a device they are the single device's list cut in 4), and the result
    is the single-device block-sparse result bit for bit: each row sums the same tiles
    in the same order. The counts equal the dense tiles' (d <= 3: exact differences); a
    20-step CEnLMC run is the same run."""
    path = tmp_path / "sparse.npz"
    env = dict(
        os.environ,
        XLA_FLAGS="--xla_force_host_platform_device_count=4",
        JAX_PLATFORMS="cpu",
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    proc = subprocess.run(
        # test_pallas, which the script imports, is beside this file
        [sys.executable, "-c", SPARSE_SCRIPT, str(path), str(Path(__file__).parent)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = np.load(path)
    assert int(out["num_devices"]) == NUM_DEVICES
    for tag in ("2048", "2000", "run"):
        # the lists fit together, within half of all tile pairs: the sparse fold ran,
        # not the dense tiles
        total = out[f"{tag}/lengths"].sum()
        assert total <= out[f"{tag}/capacity"] and bool(out[f"{tag}/shared"]), tag
    for tag in (
        "2048",
        "run",
    ):  # 512 and 256 rows a device: the single device's row tiles, cut in 4
        assert out[f"{tag}/lengths"].sum() == out[f"{tag}/single_length"], tag
    for n in (2048, 2000):
        assert (
            np.mean(out[f"{n}/single/n_ball"]) > 5
        )  # pairs are summed (about 10 a row): not vacuous
        for field in ("force_sum", "n_r2", "n_ball"):
            np.testing.assert_array_equal(
                out[f"{n}/mesh/{field}"], out[f"{n}/single/{field}"], err_msg=field
            )
        for field in ("n_r2", "n_ball"):
            np.testing.assert_array_equal(
                out[f"{n}/mesh/{field}"], out[f"{n}/dense/{field}"], err_msg=field
            )
    assert np.mean(out["run/single/fraction"][5:]) > 0.3  # the ensemble force is in use
    np.testing.assert_array_equal(out["run/mesh/position"], out["run/single/position"])


def test_block_sparse_mesh_needs_allgather_and_xla_tiles():
    x = np.zeros((8, 2), np.float32)
    z = np.zeros(8, np.float32)
    for how in (dict(strategy="ring"), dict(method="pallas")):
        with pytest.raises(
            ValueError,
            match="block_sparse=True with a mesh needs method 'auto' or 'tiled'",
        ):
            ensemble_force(x, z, z, 1.0, mesh=make_mesh(1), block_sparse=True, **how)
    with pytest.raises(
        ValueError, match="spatial_sort=True needs strategy 'allgather'"
    ):
        ensemble_force_sharded(
            x,
            z,
            z,
            1.0,
            partial_fn=tiled_partial,
            mesh=make_mesh(1),
            strategy="ring",
            spatial_sort=True,
        )
