"""Shared test settings: tests run on the CPU and are deterministic (fixed seeds).

Compiled code is released after each test module. XLA's CPU backend maps
memory regions for every executable it keeps; a run of the whole suite in one
process compiles thousands of programs, and with the caches kept the process
reaches the kernel's limit on mapped regions (``vm.max_map_count``, 65,530 by
default) about two thirds of the way through, where LLVM aborts the process
(CI exit 134). Clearing JAX's caches between modules keeps it near 1,100.

Two tiers. ``python -m pytest -q -n auto`` (the README's command, what CI runs
on every change) runs the fast tier: every test but those listed in
:data:`SLOW` (the notebooks at their small size, long statistical checks, the
slow end-to-end CLI and multi-process runs), which are marked ``slow`` here by
node-id prefix and deselected. ``--full`` (or ``CENLMC_FULL_TESTS=1``, or any
``-m`` expression such as ``-m slow``) runs them too: ``.ci/full`` does, before
a release. The marker is registered in pyproject.toml, with the per-test
``timeout`` (pytest-timeout).
"""

import atexit
import gc
import os
import shutil
import sys
import tempfile
from pathlib import Path

# The test tree mirrors the package (tests/ensemble/, tests/pairwise/, ...); a few
# modules share helpers across folders (``from test_pairwise import
# lmc_like_ensemble``), so every folder is importable.
sys.path[:0] = [
    str(p)
    for p in sorted(Path(__file__).parent.iterdir())
    if p.is_dir() and not p.name.startswith((".", "_"))
]

os.environ.setdefault("JAX_PLATFORMS", "cpu")

# A persistent compilation cache for the test session (and the notebook kernels and CLI
# processes it starts, which inherit the environment): many tests compile the same
# program again (the same sampler on the same target in another test, another module
# after the caches are cleared, every CLI job, whose closures are new), and a cache hit
# loads it from disk instead (first measured on tests/cli/test_cli.py; no results file
# holds it). CENLMC_TEST_COMPILE_CACHE: "off" disables it, a
# folder keeps it across sessions (faster reruns while developing); unset, a fresh
# folder per session, removed at its end. One folder per pytest-xdist worker: JAX
# writes a cache entry without a lock (unless eviction is on), so a worker could read
# another's half-written entry.
_cache = os.environ.get("CENLMC_TEST_COMPILE_CACHE", "")
_ours = (
    os.environ.get("CENLMC_TEST_CACHE_SET") == "1"
)  # set below in the controller, inherited by the workers
if _cache != "off" and (_ours or "JAX_COMPILATION_CACHE_DIR" not in os.environ):
    os.environ["CENLMC_TEST_CACHE_SET"] = "1"
    _worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    if _cache:
        _cache = os.path.join(_cache, _worker)
    else:
        # this process's own folder (~50 MB after the suite), removed when it exits
        _cache = tempfile.mkdtemp(prefix=f"cenlmc-test-xla-{_worker}-")
        atexit.register(shutil.rmtree, _cache, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import jax  # noqa: E402  (after JAX_PLATFORMS is set)
import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_code():
    yield
    jax.clear_caches()
    gc.collect()
    # float64 switched on globally by one module would change every later test in the
    # worker (float32 tests then pass or fail by the order pytest-xdist happens to
    # give): a module scopes it instead
    assert not jax.config.jax_enable_x64, (
        "a test module left jax_enable_x64 on: use `with jax.enable_x64(True)`"
    )


def pytest_collection_finish(session):
    if jax.config.jax_enable_x64:
        raise pytest.UsageError(
            "a test module switched jax_enable_x64 on at import: scope it to its tests "
            "(an autouse fixture `with jax.enable_x64(True): yield`)"
        )


#: Node-id prefixes (relative to the repository root) of the tests marked ``slow``: the
#: notebooks run at their small size, and the long statistical tests whose property a
#: shorter test of the same module also exercises. Seconds: one run per test file,
#: --durations, on the shared 2-core CPU at a load of 5-7 (so 2-3x an idle machine's);
#: the whole suite took ~77 min there, these ~16.
SLOW = (
    # the notebooks at their small size but the quickstart (65 s at load 1-2, in the
    # fast tier: what a new user opens first): 5 took 516 s at load 5-7 (151 the
    # longest), eight schools 207 s at load 8-11
    *(
        f"tests/test_notebooks.py::test_notebook_runs_at_small_size[{name}.ipynb]"
        for name in (
            "differentiable",
            "eight_schools",
            "inverse_problem",
            "online_lda",
            "paper2_experiments",
            "sgmcmc_logistic",
        )
    ),
    # CEnLMC's second moment within 4 MCSE of LMC's at N = 2000, d = 5 and 10: 169 s
    "tests/ensemble/test_cenlmc.py::test_guard_keeps_moments_within_mcse_of_lmc_where_the_ball_is_empty",
    # Theorem 3.3's coupling distance along a grid of radii and N: 54 s
    "tests/ensemble/test_cenlmc.py::test_coupling_distance_shrinks_with_smaller_radii_and_more_particles",
    # the tuner's fraction reached and reproduced by fresh runs, N = 1000: 70 s
    "tests/ensemble/test_tuning.py::test_tuner_reaches_the_fraction_and_a_fresh_run_reproduces_it",
    # adapted chains' moments by z-scores (Gaussian; logistic against its reference): 73
    # s and 53 s
    "tests/adaptation/test_window_adaptation.py::test_adapted_chains_have_the_gaussian_moments",
    "tests/adaptation/test_window_adaptation.py::test_adapted_chains_on_a_dict_position_have_the_logistic_posterior_moments",
    # both gradient modes give the same samples (ensembles; MALA): ~35 s each at load 12
    "tests/gradients/test_modes.py::test_ensemble_samplers",
    "tests/gradients/test_modes.py::test_mala_same_samples",
    # --- Measured in one run of the full suite (-n 2, 2 cores shared at load 6-9, call
    # times in s): a test over ~30 s there goes to the slow tier when a faster test of
    # the fast tier checks the same property. jax.grad through cj.sample, against a
    # common-random-numbers finite difference: lmc, cenlmc, sgld, complete_recipe and
    # rwmh stay in the fast tier (the ensemble, SDE and MH code paths)
    "tests/test_differentiable.py::test_pathwise_derivative_matches_common_random_numbers_finite_difference[enlmc]",
    "tests/test_differentiable.py::test_pathwise_derivative_matches_common_random_numbers_finite_difference[cenlmc_",
    "tests/test_differentiable.py::test_pathwise_derivative_matches_common_random_numbers_finite_difference[irrev",
    "tests/test_differentiable.py::test_pathwise_derivative_matches_common_random_numbers_finite_difference[sgr",
    "tests/test_differentiable.py::test_pathwise_derivative_matches_common_random_numbers_finite_difference[sghmc]",
    "tests/test_differentiable.py::test_pathwise_derivative_through_the_tiled_pair_kernels",  # 58-123 each
    "tests/test_differentiable.py::test_jacfwd_through_a_cenlmc_run_is_finite_at_n_1000",  # 42
    "tests/test_differentiable.py::test_reverse_mode_through_ensemble_force_equals_the_dense_kernel[block_sparse",
    # the CLI end to end: the default job, every sampler but cenlmc/irreversible-mh, the
    # verdicts on the small jobs and the data/model-file paths stay fast
    "tests/cli/test_cli.py::test_ctrl_c_leaves_a_resumable_checkpoint_and_resume_gives_the_same_draws",  # 182
    "tests/cli/test_cli.py::test_model_file_with_data_writes_every_output_and_summary_reprints",  # 136
    "tests/cli/test_cli.py::test_logistic_cenlmc_defaults_say_unreliable_print_the_tuner_and_exit_1",  # 79
    "tests/cli/test_cli.py::test_a_biased_cenlmc_run_is_unreliable",  # 69
    "tests/cli/test_cli.py::test_config_file_sets_flags_the_command_line_wins_and_the_effective_config_reruns",  # 64
    "tests/cli/test_cli.py::test_every_sampler_runs_from_the_command_line[cenlmc]",  # 55 (the default job is cenlmc)
    "tests/cli/test_cli.py::test_every_sampler_runs_from_the_command_line[irreversible-mh]",  # 40
    "tests/cli/test_cli.py::test_enlmc_blow_up_is_reported_by_the_main_job",  # 48
    "tests/cli/test_cli.py::test_init_file_sets_the_starting_positions",  # 44
    "tests/cli/test_cli.py::test_metropolis_samplers_adapt_during_the_burn_in",  # 40
    # ensembles: CEnLMC's stationary moments on the standard Gaussian, the first steps'
    # oracles and the blow-up flag (test_enlmc_instability_is_flagged_...) stay fast
    "tests/ensemble/test_cenlmc.py::test_jit_matches_eager_same_key_and_float64_is_preserved",  # 169
    "tests/ensemble/test_cenlmc.py::test_grad_evals_count_failed_particles_and_compaction_matches_dense",  # 76
    "tests/ensemble/test_cenlmc.py::test_cenlmc_stationary_moments_with_ensemble_force[anisotropic_gaussian_2d]",  # 63
    "tests/ensemble/test_cenlmc.py::test_coupling_distance_zero_without_ensemble",  # 51
    "tests/ensemble/test_cenlmc.py::test_enlmc_blow_up_is_detected_and_reported",  # 47
    # adaptation: the pooled warm-up on the Gaussian (MALA, RW-MH) and the step-size
    # rules stay fast
    "tests/adaptation/test_window_adaptation.py::test_adaptation_under_vmap_over_chains",  # 79
    "tests/adaptation/test_window_adaptation.py::test_pooled_warmup_reaches_the_target_acceptance[logistic",  # 17-43 each
    "tests/adaptation/test_window_adaptation.py::test_pooled_warmup_reaches_the_target_acceptance[gaussian-gamma]",  # 24
    "tests/adaptation/test_window_adaptation.py::test_pooled_warmup_reaches_the_target_acceptance[gaussian-sde]",  # 22
    "tests/cli/test_cli_defects.py::test_ctrl_c_in_the_first_compile_exits_130_and_the_folder_reruns_and_resumes",  # 50
    "tests/cli/test_cli_unconverged.py::test_the_verdict_uses_the_convergence_checks_of_cj_sample",  # 42
    "tests/ensemble/test_tuning.py::test_an_impossible_error_cap_switches_the_ensemble_off",  # 38
    # preconditioning: the warm-up against kidiq's reference (41 s alone at load 6-8;
    # the CLI's 45 s) and the CEnLMC warm-up (28 s); the diagonal-M, whitened-CEnLMC and
    # preconditioned-LMC exact tests stay fast
    "tests/adaptation/test_langevin_warmup.py::test_lmc_after_the_warm_up_matches_the_kidiq_reference_on_the_raw_scale",
    "tests/adaptation/test_langevin_warmup.py::test_cenlmc_warm_up_from_the_given_positions_finds_the_scale_and_the_exact",
    "tests/cli/test_cli_langevin_warmup.py::test_lmc_on_a_raw_scale_model_file_is_warmed_up_and_matches_the_reference",
    # block-sparse on 4 forced devices against one device, bitwise: 136 s alone at load
    # 6-8 (the sharded gradients' per-device shapes and equality,
    # tests/ensemble/test_sharded_gradients.py, stay fast)
    "tests/pairwise/test_sharded.py::test_block_sparse_on_a_mesh_equals_one_device",
    # eight schools (NumPyro) through the CLI against the posteriordb reference: 82-142
    # s at load 9 (the usage-error test of the same file, and
    # tests/models/test_numpyro.py's cj.from_numpyro checks, stay fast)
    "tests/cli/test_cli_numpyro.py::test_eight_schools_numpyro_model_through_the_cli_matches_the_reference",
    # garch11 (raw scale) through the CLI with no tuning flag, LMC, the warm-up's run
    # length (~3,000 steps x 2,000 particles) against the posteriordb reference: 295 s
    # as a test, 493 s in bench_cli_posteriordb.py, at load 8-11 (the default-steps rule
    # and the model files stay fast)
    "tests/cli/test_cli_posteriordb.py::test_cli_lmc_on_garch11_with_no_tuning_flag_matches_the_reference",
    # earnings' float32 Laplace start past a stopped L-BFGS: 87 s at load 11 (two
    # 500-iteration L-BFGS runs)
    "tests/cli/test_cli_posteriordb.py::test_laplace_start_in_float32_where_lbfgs_stops_at_the_rounding_of_the_grad",
    # --- A second pass, from a run of the fast tier (-n 2, load 6-9; call s): the fast
    # tier's total was ~1.5x the CI budget. Each of these has a faster test of the same
    # property in the fast tier:
    "tests/gradients/test_finite_difference.py::test_black_box_model_through_cenlmc_and_the_driver",  # 82; the FD-LMC test
    "tests/ensemble/test_cenlmc.py::test_the_bias_flag_fires_where_the_variance_is_measurably_inflated",  # 71; the CLI's
    "tests/models/test_numpyro.py::test_mala_run_matches_the_posteriordb_reference_means",  # 49; its transforms
    "tests/ensemble/test_cenlmc.py::test_the_default_audit_does_not_fire_on_a_healthy_cenlmc_run[anisotropic",  # 45
    "tests/cli/test_cli.py::test_logistic_lmc_default_step_size_from_curvature_matches_laplace",  # 44
    "tests/models/test_lda.py::test_library_samplers_run_the_estimator_and_beat_a_uniform_model",  # 40; the estimator's
    "tests/diagnostics/test_diagnostics.py::test_jit_matches_eager",  # 38
    "tests/ensemble/test_cenlmc.py::test_enlmc_first_step_uses_gradients_then_only_values",  # 38; the mutation oracles
    "tests/ensemble/test_cenlmc.py::test_odd_inputs_are_refused_or_handled",  # 35; tests/test_input_table.py
    "tests/diagnostics/test_convergence.py::test_a_metropolis_chain_that_never_moves_is_reported_in_both_modes",  # 34
    "tests/irreversible/test_jump.py::test_sde_proposal_with_position_dependent_d_and_q_is_exact",  # 33; the 21x21 grid
    "tests/test_differentiable.py::test_pathwise_derivative_matches_common_random_numbers_finite_difference[comp",  # 31
    "tests/ensemble/test_cenlmc.py::test_a_traced_nan_parameter_is_a_divergence",  # 31
    "tests/test_differentiable.py::test_f_star_may_be_traced",  # 30
    "tests/irreversible/test_jump.py::test_constant_dense_d_precomputed_equals_the_callable_path",  # 28
    "tests/ensemble/test_tuning.py::test_an_unreachable_fraction_takes_the_largest_candidate_within_the_caps",  # 27
    # block-sparse against the float64 oracle: five sizes of eight (and two
    # Pallas-interpret cases of four) stay fast, covering d = 1, 2, 5, 10, with and
    # without w, direct and Gram distances
    "tests/pairwise/test_sparse.py::test_matches_float64_oracle[801-3-True]",  # 33
    "tests/pairwise/test_sparse.py::test_matches_float64_oracle[500-4-False]",  # 17
    "tests/pairwise/test_sparse.py::test_matches_float64_oracle[400-7-True]",  # 18
    "tests/pairwise/test_sparse.py::test_pallas_block_sparse_matches_float64_oracle[200-3-False-direct-1.0]",  # 27
    "tests/pairwise/test_sparse.py::test_pallas_block_sparse_matches_float64_oracle[300-2-True-direct-4.0]",  # 33
    "tests/diagnostics/test_plots.py::test_ensemble_pairs_gradient_savings_and_coupling",  # 52; the trace and rank plots
    # the least-squares estimator inside CEnLMC, by its stationary law (30 s at load
    # 8-9); its exactness, bias, tiled-vs-dense and jit/vmap tests stay fast
    "tests/ensemble/test_least_squares.py::test_cenlmc_least_squares_quadratic_is_ula_on_a_gaussian",
    # --- A third pass, from CI's own run of the fast tier (1,100 tests, 1,192 s of
    # pytest on 2 cores; the whole CI job over its 20-minute target). Call seconds from
    # a clean-clone run at load ~2: the ring's equality in distribution over 200 steps
    # (68 s); allgather's bitwise equality and the ring's per-step rounding bound stay
    # fast in tests/pairwise/test_sharded.py
    "tests/test_sharded_runs.py::test_allgather_is_the_same_run_and_ring_the_same_distribution",
    # LMC on the 4-d problem against a MALA reference (41 s); SIR by MALA and Darcy by
    # LMC stay fast
    "tests/models/test_inverse_problems.py::test_mala_reference_in_four_dimensions_and_lmc_against_it",
    # the black-box model through CEnLMC (27 s); the black box equal to the JAX model
    # and the finite-difference LMC against autodiff stay fast
    "tests/models/test_inverse_problems.py::test_black_box_through_cenlmc_and_the_driver",
    # EnLMC's same-key and vmap checks (27 s, 9 s) go through the ensemble code that
    # CEnLMC's (fast) runs; CEnLMC's vmap over ensembles (21 s) likewise through EnLMC's
    "tests/test_samplers.py::test_same_key_same_samples_and_typed_equals_legacy_key[enlmc]",
    "tests/test_samplers.py::test_vmap_over_ensembles_or_chains_equals_one_by_one[cenlmc]",
    # --- A fourth pass, from a clean-clone run of .ci/run (1,153 tests, 1,250 s of
    # pytest at load ~2; call s): the sharded force (ring, Pallas) on 4 devices (37 s);
    # the sharded CEnLMC run bitwise on 4 devices
    # (tests/ensemble/test_sharded_gradients.py,
    # test_same_cenlmc_step_call_runs_sharded...) and the sharded force's CUDA lowering
    # on an abstract 8-device mesh (tests/pairwise/test_lowering.py) stay fast
    "tests/pairwise/test_sharded.py::test_runs_on_four_devices",
    # the trace and rank plots (25 s); the quickstart notebook's plots and
    # tests/diagnostics/test_named_draws.py's stay fast
    "tests/diagnostics/test_plots.py::test_trace_and_rank_plots",
    # a streaming run's constrained final state (11 s); the traced runs' constrained
    # summaries stay fast
    "tests/diagnostics/test_named_draws.py::test_streaming_run",
    # --- A fifth pass, from a run of the fast tier (-n 2, 2 cores shared with two
    # other jobs, load ~4; call s): the least-squares Pallas kernel (interpreted on
    # CPU) against the dense fit: d = 1, 2, 3 without weights (both kernels among
    # them) and one weighted case stay fast
    *(
        f"tests/ensemble/test_least_squares_pallas.py::test_matches_dense[{case}]"
        for case in (
            "3-True-epanechnikov",  # 52
            "3-True-uniform",  # 32
            "2-True-epanechnikov",  # 24
            "2-True-uniform",  # 18
            "1-True-epanechnikov",  # 17
            "2-False-epanechnikov",  # 23
            "1-False-epanechnikov",  # 22
            "3-False-uniform",  # 18
        )
    ),
    # its reverse mode with weights (38); without weights stays fast
    "tests/ensemble/test_least_squares_pallas.py::test_reverse_mode_matches_tiled[True]",
    # gradient-free ensemble MALA: the dtype check of the quadratic fit (57; the
    # local-linear one stays fast) and the Gaussian moment z-tests (24, 23; the banana
    # and the skew funnel, non-Gaussian, stay fast)
    "tests/ensemble/test_ensemble_mala.py::test_dtype_is_preserved[quadratic]",
    "tests/ensemble/test_ensemble_mala.py::test_moments_match_exact_values[gaussian-",
    # EnLMC jitted against eager (38): CEnLMC's, through the same ensemble code, stays
    "tests/test_samplers.py::test_jit_matches_eager[enlmc]",
    # Darcy's former CEnLMC suggestion flagged (42): Darcy by LMC and SIR by exact
    # MALA stay fast
    "tests/models/test_inverse_problems.py::test_darcy_cenlmc_former_suggestion_is_flagged_and_the_new_one_is_within_tolerance",  # noqa: E501
    # tile-size independence at block 7 (16); block 2 stays fast
    "tests/pairwise/test_pairwise.py::test_block_size_does_not_matter[7]",
    # the pooled warm-up's acceptance for RW-MH (24); MALA's stays fast
    "tests/adaptation/test_window_adaptation.py::test_pooled_warmup_reaches_the_target_acceptance[gaussian-rwmh]",  # noqa: E501
    # --- A sixth pass, from a run of the whole fast tier with --durations (-n 2, 2
    # cores shared with two other sessions, load ~8: call s are ~2.7x an idle
    # machine's; user CPU 43 min, CI's pytest ~20 min). Forced-device and multi-process
    # runs first: two processes of jax.distributed (142): the sharded runs on four
    # forced devices in one process (tests/pairwise/test_sharded.py's allgather
    # bitwise tests, test_same_cenlmc_step_call_runs_sharded_with_the_same_samples)
    # and the checkpoint tests of tests/test_run.py stay fast
    "tests/test_multihost.py::test_two_processes_summarise_export_checkpoint_and_resume_like_one",  # noqa: E501
    # the sharded gradient buffers on four forced devices (81, one subprocess); the
    # sharded CEnLMC step bitwise (test_same_cenlmc_step_call_runs_sharded...) stays
    "tests/ensemble/test_sharded_gradients.py::",
    # the sharded least-squares fit on four forced devices (104, one subprocess); its
    # tiled/sparse-vs-dense fits on one device and the sharded pair force stay fast
    "tests/ensemble/test_least_squares_backends.py::test_the_sharded_fit_is_the_single_device_fit_bit_for_bit",  # noqa: E501
    "tests/ensemble/test_least_squares_backends.py::test_a_sharded_cenlmc_chain_with_the_fit_follows_the_single_device_chain",  # noqa: E501
    # one case of a parametrised test where the others check the same property:
    # Gamma's moments on N(0, 1) (49; on the double well against quadrature stays)
    "tests/irreversible/test_jump.py::test_moments_on_1d_gaussian[gamma]",
    # the cache after many steps with scalar D (25; D as a matrix, two cases, stays)
    "tests/irreversible/test_jump.py::test_the_cache_is_the_point_s_drift_after_many_steps[1.0]",  # noqa: E501
    # the pair force against the float64 oracle with 64-row tiles at d = 1 and 3
    # (6-9 each; the default tiles of the same sizes and the other sizes stay)
    *(
        f"tests/pairwise/test_pairwise.py::test_matches_float64_oracle_random[{case}]"
        for case in (
            "257-1-True-tiled-64",
            "257-1-True-tiled_cols-64",
            "240-3-True-tiled-64",
            "240-3-True-tiled_cols-64",
        )
    ),
    # block-sparse on a clustered ensemble at d = 6 (31; the skewed one at d = 3 and
    # the others stay) and its Pallas-interpreted Gram case (37; the direct case stays,
    # and the dense Pallas kernel's Gram oracle in tests/pairwise/test_pallas.py)
    "tests/pairwise/test_sparse.py::test_awkward_ensembles[clustered-6]",
    "tests/pairwise/test_sparse.py::test_pallas_block_sparse_matches_float64_oracle[176-5-True-gram-1.0]",  # noqa: E501
    # the summary's diagnostics against the public ones with 3 chains (27; 4 stays)
    "tests/diagnostics/test_summary_diagnostics.py::test_equal_to_the_public_diagnostics[3-41]",  # noqa: E501
    # EnLMC's instability flag at two more seeds (22 each; seed 0 stays)
    "tests/ensemble/test_cenlmc.py::test_enlmc_instability_is_flagged_before_the_second_moment_doubles[1]",  # noqa: E501
    "tests/ensemble/test_cenlmc.py::test_enlmc_instability_is_flagged_before_the_second_moment_doubles[2]",  # noqa: E501
    # the sparse least-squares fit at d = 3 (22; d = 1, 2 stay)
    "tests/ensemble/test_least_squares.py::test_sparse_equals_dense_and_skips_far_tiles[3]",  # noqa: E501
    # ensemble MALA's banana z-test with the quadratic fit (20; with the local-linear
    # fit, and the skew funnel with the quadratic one, stay)
    "tests/ensemble/test_ensemble_mala.py::test_moments_match_exact_values[banana-quadratic-0.5]",  # noqa: E501
    # --- A seventh pass (the same durations run; a clean-clone .ci/run after the sixth
    # took 21.3 min, pytest 1,120 s, still over the 20-minute target). The exact
    # default's rotated 100-d Gaussian (78; the banana and funnel z-tests of the same
    # file, and preconditioned LMC's dense-M Lyapunov test, stay) and its float32
    # dense-M fit (60; the float32 warm-up and hand-over in test_same_key_same_draws_
    # and_float32_stays_float32 stays; benchmarks/mutation_check.py runs it with --full)
    "tests/adaptation/test_kinetic.py::test_rotated_badly_scaled_gaussian_gets_a_dense_metric_and_exact_variances",  # noqa: E501
    "tests/adaptation/test_kinetic.py::test_float32_dense_metric_is_fitted_to_the_dtype_not_refused",  # noqa: E501
    # every sampler's healthy run raises no flag (73); the driver's negative cases
    # (tests/test_run.py::test_moving_chains_short_chunks_and_mh_samplers_are_not_
    # reported) and each sampler's own tests, which fail on a warning, stay
    "tests/test_input_table.py::test_a_healthy_run_raises_no_flag",
    # the SDE-proposal sampler's covariance on a correlated Gaussian (30; Q = 0 equal
    # to MALA and the proposal densities of eq. 8.1 stay)
    "tests/irreversible/test_jump.py::test_sde_proposal_sampler_covariance_on_correlated_gaussian",  # noqa: E501
    # one case of a parametrised test where the others check the same property
    "tests/diagnostics/test_diagnostics.py::test_ess_rhat_mcse_match_arviz_on_the_same_chains[37]",  # noqa: E501
    "tests/sgmcmc/test_sgrhmc.py::test_gamma_r_is_the_recipes_gamma_term[False-gsgrhmc]",  # noqa: E501
    "tests/sgmcmc/test_sgrhmc.py::test_gamma_r_is_the_recipes_gamma_term[False-rotated]",  # noqa: E501
    *(
        f"tests/pairwise/test_pairwise.py::test_matches_float64_oracle_random[{case}]"
        for case in (
            "300-2-False-tiled_cols-64",
            "300-10-True-tiled_cols-64",
            "200-10-False-tiled_cols-64",
        )
    ),
    "tests/pairwise/test_pallas.py::test_direct_matches_float64_oracle[150-50-False]",
    "tests/ensemble/test_lmc_preconditioned.py::test_stationary_covariance_is_the_lyapunov_solution[diagonal]",  # noqa: E501
    "tests/models/test_inverse_problems.py::test_quadrature_reference_is_converged[darcy]",  # noqa: E501
    "tests/ensemble/test_f_star.py::test_find_f_star_matches_known_minimum_float32[gaussian_mixture_2x2d]",  # noqa: E501
)


def pytest_addoption(parser):
    parser.addoption(
        "--full",
        action="store_true",
        default=False,
        help="also run the slow tier (tests/conftest.py SLOW: notebooks, long statistical tests)",
    )


def _full(config) -> bool:
    return (
        config.getoption("--full")
        or os.environ.get("CENLMC_FULL_TESTS") == "1"
        or bool(config.option.markexpr)
    )


def pytest_collection_modifyitems(config, items):
    slow = [item for item in items if item.nodeid.startswith(SLOW)]
    for item in slow:
        item.add_marker(pytest.mark.slow)
    if slow and not _full(config):
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.nodeid.startswith(SLOW)]
        config._cenlmc_slow_deselected = len(slow)


def pytest_terminal_summary(terminalreporter, config):
    # under pytest-xdist the workers collect (and deselect), so the controller knows no
    # count
    if not _full(config):
        n = getattr(config, "_cenlmc_slow_deselected", None)
        what = (
            f"{n} tests of the slow tier"
            if n
            else "the slow tier (tests/conftest.py SLOW)"
        )
        terminalreporter.write_line(
            f"{what} not run: `python -m pytest -q -n auto --full` runs it (README, "
            "'Run the tests')"
        )
