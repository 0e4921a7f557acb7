"""The raw-scale posteriordb model files of examples/posteriordb/ and the CLI's default
run length (issue 18).

``cenlmc-jax sample --sampler lmc | cenlmc`` given one of these files and no tuning flag
warms up with ``cj.langevin_warmup`` and, with ``--steps`` unset, runs long enough for
its own R-hat check (``jobs.default_steps``, from the warm-up's measured relaxation
time). benchmarks/bench_cli_posteriordb.py runs all six (results in
benchmarks/results/cli_posteriordb.md); the slow test here runs garch11 with LMC, the
one whose default run of 1,000 steps was flagged (R-hat 1.1-1.3).
"""

import importlib.util
import json
import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from cli_helpers import run_cli

from cenlmc_jax.cli import jobs, verdict
from cenlmc_jax.cli.samplers import Job
from cenlmc_jax.diagnostics import mcse
from cenlmc_jax.models import posteriordb as pdb

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "posteriordb"
sys.path.insert(0, str(EXAMPLES))
from make_data import write as write_data  # noqa: E402

MODELS = {
    "kidiq": ("kidiq-kidscore_momiq", "csv", 3),
    "garch11": ("garch-garch11", "npz", 4),
    "earnings": ("earnings-earn_height", "csv", 3),
}


def _module(name):
    spec = importlib.util.spec_from_file_location(
        f"example_{name}", EXAMPLES / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_model_files_are_the_posteriordb_densities_up_to_a_constant(name, tmp_path):
    """Each file's ``logp(x, data)`` (data as the CLI loads it) minus the library's
    posteriordb log density is the same constant at random points (float64: equal to
    1e-9 relative to the densities' size, rounding)."""
    post = pdb.load(MODELS[name][0])
    files = write_data(tmp_path)
    logp = _module(name).logp
    with jax.enable_x64(True):
        data = {k: jnp.asarray(v) for k, v in jobs.load_data(str(files[name])).items()}
        xs = np.random.default_rng(0).normal(size=(5, post.d)) * 0.5
        ours = np.array([float(logp(jnp.asarray(x), data)) for x in xs])
        ref = np.array([float(post.logdensity_fn(jnp.asarray(x))) for x in xs])
    diff = ours - ref
    np.testing.assert_allclose(diff, diff[0], rtol=0, atol=1e-9 * np.max(np.abs(ref)))


def test_default_steps_follow_the_relaxation_time():
    """``T = 16τ / (R² − 1)`` (jobs.default_steps' docstring), at least 1,000, at most
    20,000, a multiple of thin; no relaxation time (a job not warmed up): 1,000. The
    R-hat it aims below is the verdict's."""
    assert jobs.RHAT_TARGET == verdict.RHAT_MAX
    job = lambda tau: Job(
        None, None, "", {} if tau is None else dict(relaxation_steps=tau)
    )  # noqa: E731
    assert (
        jobs.default_steps(job(None)) == 1000 and jobs.default_steps(job(5.0)) == 1000
    )
    expected = math.ceil(16 * 100.0 / (jobs.RHAT_TARGET**2 - 1))
    assert jobs.default_steps(job(100.0)) == expected
    assert jobs.default_steps(job(100.0), thin=7) == 7 * math.ceil(expected / 7)
    assert jobs.default_steps(job(1e6)) == jobs.MAX_DEFAULT_STEPS
    assert jobs.default_steps(job(float("nan"))) == 1000


def test_cli_lmc_on_garch11_with_no_tuning_flag_matches_the_reference(tmp_path, capsys):
    """garch11 (d = 4: mu, log alpha0, logit alpha1, logit(beta1 / (1 - alpha1)))
    through the CLI as a user runs it: the warm-up's relaxation time sets the run length
    (several thousand steps; the default 1,000 left R-hat at 1.1-1.3), the run exits 0,
    and every reference quantity's mean is within ``0.1 ref_sd + 3 MCSE`` and its sd
    within 10% (tests/adaptation/test_langevin_warmup.py says why these tolerances)."""
    files = write_data(tmp_path / "data")
    out = tmp_path / "run"
    code, text, err = run_cli(
        [
            "sample",
            "--model",
            f"{EXAMPLES / 'garch11.py'}:logp",
            "--data",
            str(files["garch11"]),
            "--dim",
            "4",
            "--sampler",
            "lmc",
            "--trace",
            "--out",
            str(out),
        ],
        capsys,
    )
    assert code == 0, text + err
    record = json.loads((out / "run.json").read_text())
    tau = record["parameters"]["relaxation_steps"]
    assert (
        record["config"]["steps"]
        == jobs.default_steps(Job(None, None, "", dict(relaxation_steps=tau)))
        > 1000
    )
    post = pdb.load("garch-garch11")
    with np.load(out / "draws.npz") as f:
        draws = f["draws"].astype(np.float64)
    with jax.enable_x64(True):
        z = np.asarray(jax.vmap(jax.vmap(post.constrain_array))(draws), np.float64)
    flat = z.reshape(-1, z.shape[-1])
    mean, sd = flat.mean(0), flat.std(0, ddof=1)
    se = np.asarray(mcse(z, chain_axis=0, sample_axis=1, split=True))
    assert np.all(np.abs(mean - post.ref_mean) <= 0.1 * post.ref_sd + 3 * se), (
        mean,
        post.ref_mean,
        se,
    )
    assert np.all(np.abs(sd / post.ref_sd - 1) <= 0.1), (sd, post.ref_sd)


def test_laplace_start_in_float32_where_lbfgs_stops_at_the_rounding_of_the_gradient():
    """earnings on the raw scale in float32 (the CLI's dtype): f ≈ 1.2e4 at the mode, so
    |∇f| cannot fall below ~1e-3 and find_f_star (tol sqrt(eps) = 3.5e-4) reports no
    convergence; the warm-up still starts from the Laplace approximation there (Newton
    decrement ~1e-9 <= 0.01) instead of from the given positions (where the curvature
    rule gave h = 7e-13 and nothing moved: R-hat 172). The ensemble is then at the
    posterior: its mean of beta[1], beta[2] within ``0.1 ref_sd + 3 ref_sd / sqrt(N)``
    of the reference (the ensemble's sd is at most ref_sd), where a start from the given
    N(0, 1) positions is 6 ref_sd away."""
    import cenlmc_jax as cj

    post = pdb.load("earnings-earn_height")
    n = 256
    x0 = jax.random.normal(jax.random.key(0), (n, post.d), jnp.float32)
    assert not bool(cj.ensemble.tuning.find_f_star(post.logdensity_fn, x0).converged)
    wu = cj.langevin_warmup(jax.random.key(1), post.logdensity_fn, x0, num_steps=20)
    assert wu.info.start == "laplace", wu.info.reasoning
    mean = np.asarray(wu.positions, np.float64).mean(0)[:2]
    ref_mean, ref_sd = post.ref_mean[:2], post.ref_sd[:2]
    assert np.all(
        np.abs(mean - ref_mean) <= 0.1 * ref_sd + 3 * ref_sd / math.sqrt(n)
    ), (mean, ref_mean)
