"""Mutation check: do the tests see the bugs they are meant to see?

``python benchmarks/mutation_check.py [--only NAME ...] [--out-dir DIR]``

Each entry of :data:`MUTATIONS` is a realistic one-line bug: a file of the
package, its exact original text (which must occur exactly once), the
replacement, and the test node ids that must catch it. For each mutation the
script

1. copies the working tree (tracked files and untracked, non-ignored ones:
   ``git ls-files -co --exclude-standard``, so uncommitted edits are included)
   to a fresh temporary directory; the real working tree is never touched;
2. applies the edit in the copy (asserting the original text occurs once);
3. runs the listed tests there with pytest (``PYTHONPATH`` = the copy, which
   shadows the editable install; checked before the first run), reading
   the per-test outcome from a JUnit XML report;
4. records the mutation as *caught* when every listed test fails (or errors).

A baseline run of all listed tests on an unmutated copy comes first: they
must pass, or "caught" would mean nothing. Results go to
``benchmarks/results/mutations.json`` and ``mutations.md``; the exit status
is non-zero when the baseline fails or any mutation is missed.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
GAPS = "tests/test_mutation_gaps.py::"

SAMPLERS = "cenlmc_jax/ensemble/cenlmc.py"
ENLMC = "cenlmc_jax/ensemble/enlmc.py"
LINALG = "cenlmc_jax/_linalg.py"
RECIPE = "cenlmc_jax/sgmcmc/recipe.py"
PROPOSALS = "cenlmc_jax/irreversible/proposals.py"

T_ENLMC_STEP = (
    GAPS + "test_enlmc_one_step_uses_the_force_as_w_minus_h_force_over_n_minus_1"
)
T_ENLMC_STAT = GAPS + "test_enlmc_first_steps_follow_the_exact_lmc_mean_recursion"
T_CENLMC_HAND = (
    GAPS + "test_cenlmc_one_step_force_normaliser_and_tests_against_numpy_oracle"
)
T_CENLMC_REAL = GAPS + "test_cenlmc_one_step_after_a_real_step_against_numpy_oracle"
T_GAMMA = (
    GAPS
    + "test_gamma_term_of_every_matrix_form_in_d_and_q_matches_jacfwd_of_the_matrix_field"  # noqa: E501
)
T_RECIPE_STEP = (
    GAPS + "test_recipe_step_with_a_scalar_d_of_z_is_the_hand_written_euler_step"
)
T_RECIPE_STAT = (
    GAPS
    + "test_complete_recipe_with_position_dependent_d_has_the_stationary_second_moment"
)
T_SDE_GRID = (
    GAPS
    + "test_irreversible_sde_sampler_kernel_leaves_pi_times_uniform_direction_invariant_on_a_grid"  # noqa: E501
)
T_SDE_DRAW = GAPS + "test_sde_proposal_draws_from_its_own_forward_density"
LANGEVIN = "cenlmc_jax/ensemble/lmc.py"
T_LOOKAHEAD = "tests/ensemble/test_cenlmc.py::"
VERDICT = "cenlmc_jax/cli/verdict.py"
T_SCHEDULE = (
    "tests/test_schedules.py::test_a_schedule_gives_the_exact_moment_recursion[lmc]"
)
T_FLAGS = "tests/cli/test_cli_run_flags.py::"
T_INTERRUPTS = "tests/cli/test_cli_interrupts.py::"
T_FLAGS_TOY = (
    T_FLAGS + "test_every_flag_the_driver_warns_about_is_a_problem_of_the_verdict"
)

#: (name, file, original text, replacement, tests that must catch it, what the bug is)
MUTATIONS = [
    dict(
        name="cli_keeps_pythons_shutdown",
        file="cenlmc_jax/cli/__init__.py",
        original="(code == verdict.EXIT_INTERRUPTED or not user_code)",
        replacement="(code == verdict.EXIT_INTERRUPTED)",
        tests=[
            T_INTERRUPTS
            + "test_the_command_skips_pythons_shutdown_and_still_writes_everything",
        ],
        what="the command pays Python's shutdown (~0.35 s of CPU) after its work",
    ),
    dict(
        name="cli_skips_the_models_shutdown",
        file="cenlmc_jax/cli/__init__.py",
        original="(code == verdict.EXIT_INTERRUPTED or not user_code)",
        replacement="(code == verdict.EXIT_INTERRUPTED or True)",
        tests=[
            T_INTERRUPTS
            + "test_a_models_own_buffered_file_and_atexit_hook_survive_the_command",
        ],
        what="a --model's buffered file and atexit hook lost by os._exit",
    ),
    dict(
        name="cli_dies_with_its_reader",
        file="cenlmc_jax/cli/__init__.py",
        original="        sys.stdout, sys.stderr = _ReaderMayGo(sys.stdout), "
        "_ReaderMayGo(sys.stderr)\n",
        replacement="        pass\n",
        tests=[
            T_INTERRUPTS
            + "test_a_reader_that_ends_first_stops_neither_the_run_nor_its_files",
        ],
        what="`cenlmc-jax sample --out DIR | head` stops with a traceback, no files",
    ),
    dict(
        name="pallas_overflow_reports_no_fallback",
        file="cenlmc_jax/pairwise/pallas.py",
        original="            return_fallback=return_fallback,\n        )\n\n"
        "    return lax.cond",
        replacement="            return_fallback=False,\n"
        "        ), jnp.asarray(False)\n\n    return lax.cond",
        tests=[
            "tests/pairwise/test_sparse.py::test_pallas_overflowing_lists_run_the_xla_tiles"
            "[400-True]",
        ],
        what="a Pallas call whose lists overflow hides whether its fallback went dense",
    ),
    dict(
        name="packed_counts_swapped",
        file="cenlmc_jax/pairwise/algebra.py",
        original="    return both & ((1 << shift) - 1), both >> shift",
        replacement="    return both >> shift, both & ((1 << shift) - 1)",
        tests=[
            "tests/pairwise/test_pairwise.py::test_packed_counts_equal_two_sums[32]",
            "tests/pairwise/test_sparse.py::test_matches_float64_oracle[601-2-True]",
        ],
        what="the tile kernel's packed R2 and ball counts decoded the wrong way round",
    ),
    dict(
        name="sparse_fold_pads_the_force_operand_on_the_left",
        file="cenlmc_jax/pairwise/tiled.py",
        original="(0, 0), (0, -(d + 1) % LIFT_COLUMNS)",
        replacement="(0, 0), (-(d + 1) % LIFT_COLUMNS, 0)",
        tests=[
            "tests/pairwise/test_sparse.py::test_matches_float64_oracle[601-2-True]",
            "tests/pairwise/test_sparse.py::test_matches_float64_oracle[601-2-False]",
        ],
        what="the block-sparse fold's zero columns go before the force operand's",
    ),
    dict(
        name="ensemble_mala_without_reverse_proposal",
        file="cenlmc_jax/ensemble/ensemble_mala.py",
        original="log_ratio = l_y - l_a + log_backward - log_forward",
        replacement="log_ratio = l_y - l_a",
        # [quadratic] only: under this mutation the [local_linear] case hung (XLA:CPU,
        # the process asleep) until killed, on 2026-12-03; not investigated
        tests=[
            "tests/ensemble/test_ensemble_mala.py::"
            "test_one_step_from_pi_stays_pi[quadratic]"
        ],
        what="ensemble MALA's MH ratio without the proposal densities (not exact)",
    ),
    dict(
        name="online_rhat_without_between_chains",
        file="cenlmc_jax/diagnostics/online.py",
        original="+ jnp.var(mean, axis=0, ddof=1)",
        replacement="+ 0.0 * jnp.var(mean, axis=0, ddof=1)",
        tests=[
            "tests/diagnostics/test_online.py::"
            "test_chains_stuck_apart_are_flagged_in_stream_mode"
        ],
        what="the streamed split R-hat ignores the between-chain variance",
    ),
    dict(
        name="float32_metric_not_fitted",
        file="cenlmc_jax/adaptation/kinetic.py",
        original="    if lam >= need:\n        return m_mat, 0.0",
        replacement="    if True:\n        return m_mat, 0.0",
        tests=[
            "tests/adaptation/test_kinetic.py::"
            "test_float32_dense_metric_is_fitted_to_the_dtype_not_refused"
        ],
        what="the warm-up hands over a float32 M the sampler refuses (issue 28)",
    ),
    dict(
        name="m_f_test_without_f_star",
        file=SAMPLERS,
        original="fail_mf = ~(f <= fs + jnp.asarray(m_f, dt))",
        replacement="fail_mf = ~(f <= jnp.asarray(m_f, dt))",
        tests=[
            "tests/ensemble/test_cenlmc.py::"
            "test_the_m_f_test_is_relative_to_f_star_far_from_zero"
        ],
        what="the M_f test reads f <= M_f instead of f <= f* + M_f (issue 28)",
    ),
    dict(
        name="enlmc_force_sign_flipped",
        file=ENLMC,
        original="ens = pf.force_sum / jnp.asarray(n - 1, x.dtype)",
        replacement="ens = -pf.force_sum / jnp.asarray(n - 1, x.dtype)",
        tests=[T_ENLMC_STEP, T_ENLMC_STAT],
        what="EnLMC moves along +F instead of -F",
    ),
    dict(
        name="enlmc_normaliser_n",
        file=ENLMC,
        original="ens = pf.force_sum / jnp.asarray(n - 1, x.dtype)",
        replacement="ens = pf.force_sum / jnp.asarray(n, x.dtype)",
        tests=[T_ENLMC_STEP],
        what="EnLMC divides by N instead of N-1",
    ),
    dict(
        name="cenlmc_force_sign_flipped",
        file=SAMPLERS,
        original="ens = pf.force_sum / jnp.maximum(pf.n_r2, 1).astype(dt)[:, None]",
        replacement="ens = -pf.force_sum / jnp.maximum(pf.n_r2, 1).astype(dt)[:, None]",
        tests=[T_CENLMC_HAND, T_CENLMC_REAL],
        what="CEnLMC moves along +F instead of -F",
    ),
    dict(
        name="cenlmc_normaliser_off_by_one",
        file=SAMPLERS,
        original="ens = pf.force_sum / jnp.maximum(pf.n_r2, 1).astype(dt)[:, None]",
        replacement="ens = pf.force_sum / "
        "jnp.maximum(pf.n_r2 + 1, 1).astype(dt)[:, None]",
        tests=[T_CENLMC_HAND, T_CENLMC_REAL],
        what="CEnLMC divides by N_i + 1 instead of N_i",
    ),
    dict(
        name="n_star_test_off_by_one_le",
        file=SAMPLERS,
        original="(pf.n_r2 < jnp.maximum(jnp.asarray(n_star, jnp.int32), 1))",
        replacement="(pf.n_r2 <= jnp.maximum(jnp.asarray(n_star, jnp.int32), 1))",
        tests=[T_CENLMC_HAND],
        what="N_i = N* counted as a failure (N_i <= N*)",
    ),
    dict(
        name="n_star_test_off_by_one_minus",
        file=SAMPLERS,
        original="(pf.n_r2 < jnp.maximum(jnp.asarray(n_star, jnp.int32), 1))",
        replacement="(pf.n_r2 < jnp.maximum(jnp.asarray(n_star - 1, jnp.int32), 1))",
        tests=[T_CENLMC_HAND],
        what="N_i = N* - 1 passes (threshold N* - 1)",
    ),
    dict(
        name="gamma_scalar_form_zeroed",
        file=LINALG,
        original="            div = jac\n",
        replacement="            div = jnp.zeros_like(jac)\n",
        tests=[T_GAMMA + "[scalar]", T_RECIPE_STEP, T_RECIPE_STAT],
        what="Γ of a scalar-valued callable c(z)·I is 0",
    ),
    dict(
        name="gamma_diagonal_form_zeroed",
        file=LINALG,
        original="            div = jnp.diagonal(jac)\n",
        replacement="            div = jnp.zeros(jac.shape[:1], jac.dtype)\n",
        tests=[T_GAMMA + "[diagonal]"],
        what="Γ of a diagonal callable diag(v(z)) is 0",
    ),
    dict(
        name="gamma_dense_form_transposed",
        file=LINALG,
        original='div = jnp.einsum("ijj->i", jac)',
        replacement='div = jnp.einsum("jij->i", jac)',
        tests=[T_GAMMA + "[dense]"],
        what="dense Γ_i = Σ_j ∂_j M_ji (the transpose's divergence)",
    ),
    dict(
        name="recipe_gamma_dropped",
        file=RECIPE,
        original="        drift = drift + la.gamma_term(D, Q, z)\n",
        replacement="        pass  # mutation: Γ dropped\n",
        tests=[T_RECIPE_STEP, T_RECIPE_STAT],
        what="the complete recipe's drift without Γ",
    ),
    dict(
        name="sde_backward_without_adjoint",
        file=PROPOSALS,
        original="return log_density(z, z_star, -direction[0], cached(z_star, cache))",
        replacement="return log_density("
        "z, z_star, direction[0], cached(z_star, cache))",
        tests=[T_SDE_GRID],
        what="SDE proposal's backward density g̃ from the forward process (no Q -> -Q)",
    ),
    dict(
        name="sde_sample_direction_flipped",
        file=PROPOSALS,
        original="return mean(z, direction[0], point) + jnp.sqrt",
        replacement="return mean(z, -direction[0], point) + jnp.sqrt",
        tests=[T_SDE_DRAW],
        what="SDE proposal draws with -s while its density uses s",
    ),
    dict(
        name="lmc_schedule_at_step_0",
        file=LANGEVIN,
        original="step_size_at(step_size, state.step, x.dtype)",
        replacement="step_size_at(step_size, 0 * state.step, x.dtype)",
        tests=[T_SCHEDULE],
        what="LMC evaluates its step-size schedule at t = 0 at every step",
    ),
    dict(
        name="verdict_ignores_the_run_flags",
        file=VERDICT,
        original="    out += flag_problems(args, res, notes)\n",
        replacement="    pass  # mutation: the infos' run_flags not read\n",
        tests=[
            T_FLAGS
            + "test_a_flag_the_driver_warns_about_makes_the_job_unreliable[any_step]",
            T_FLAGS + "test_a_collapsed_acceptance_rate_is_unreliable_by_its_own_flag",
        ],
        what="the CLI's verdict does not read the infos' run_flags",
    ),
    dict(
        name="verdict_kept_only_reads_the_burn_in",
        file=VERDICT,
        original="lambda a: a[burn_in:], fetch(info))\n        offset = burn_in",
        replacement="lambda a: a, fetch(info))\n        offset = 0",
        tests=[
            T_FLAGS_TOY + "[kept_only_burn_in_does_not_count-None]",
            T_FLAGS_TOY + "[kept_only_burn_in_does_not_count-mean]",
        ],
        what="a kept_only flag set during the burn-in counts in the verdict",
    ),
    dict(
        name="verdict_every_step_stretch_one_short",
        file=VERDICT,
        original="stuck = longest >= WATCH_MIN_STEPS",
        replacement="stuck = longest >= WATCH_MIN_STEPS - 1",
        tests=[
            T_FLAGS_TOY + "[every_step_one_step_short-None]",
            T_FLAGS_TOY + "[every_step_one_step_short-mean]",
        ],
        what="an every_step flag reported after WATCH_MIN_STEPS - 1 consecutive steps",
    ),
    dict(
        name="bound_step_ignores_parameter_types",
        file="cenlmc_jax/_steps.py",
        original="key = tuple((name, type(value), value) for",
        replacement="key = tuple((name, object, value) for",
        tests=[
            "tests/test_bound_step.py::test_other_parameters_or_functions_are_other_steps"
        ],
        what="a step with step_size=1 shares the compiled run of one with "
        "step_size=1.0",
    ),
    dict(
        name="auto_block_sparse_from_above_the_threshold",
        file="cenlmc_jax/pairwise/__init__.py",
        original="return any(d <= max_d and n >= min_n for",
        replacement="return any(d <= max_d and n > min_n for",
        tests=[
            "tests/pairwise/test_sparse.py::test_auto_takes_block_sparse_by_the_rule"
        ],
        what="method='auto' takes block-sparse only above a rule row's N, not from it",
    ),
    dict(
        name="unused_ensemble_floor_ignored",
        file="cenlmc_jax/run.py",
        original="not float(np.mean(value)) >= flag.mean_below",
        replacement="not float(np.mean(value)) >= 0.0",
        tests=[
            "tests/ensemble/test_cenlmc.py::test_an_unused_ensemble_warns_with_its_fraction",
            T_FLAGS_TOY + "[mean_below_most_kept_steps-None]",
        ],
        what="cj.sample never warns of an unused ensemble (a mean fraction of 0 passes "
        "the floor)",
    ),
    dict(
        name="lookahead_gradients_of_other_rows",
        file="cenlmc_jax/ensemble/cenlmc.py",
        original="grad = jnp.where(la.have[:, None], la.grad.astype(grad.dtype), grad)",
        replacement="grad = jnp.where(la.have[:, None], "
        "jnp.roll(la.grad, 1, axis=0).astype(grad.dtype), grad)",
        tests=[
            T_LOOKAHEAD + "test_lookahead_is_the_same_chain_in_one_model_call_a_step"
        ],
        what="the lookahead's gradients handed to the wrong particles",
    ),
    dict(
        name="lookahead_misses_not_computed",
        file="cenlmc_jax/ensemble/cenlmc.py",
        original="missing = (need | audited) & ~la.have",
        replacement="missing = audited & ~la.have",
        tests=[
            T_LOOKAHEAD
            + "test_a_state_without_lookahead_gradients_takes_them_all_in_a_second_call"
        ],
        what="a gradient the lookahead did not foresee is never computed (a zero "
        "force)",
    ),
    dict(
        name="drift_bias_ignored",
        file="cenlmc_jax/ensemble/audit.py",
        original="jnp.abs(running_bias) <= AUDIT_DRIFT_BIAS_THRESHOLD",
        replacement="jnp.abs(running_bias) >= 0",
        # a steady bias is flagged early (from step 20, beyond 4 standard errors) all
        # the same; a noisy one only by the 200-step rule this mutation removes
        tests=[
            "tests/ensemble/test_audit.py::"
            "test_a_noisy_drift_bias_waits_until_it_is_beyond_its_noise[-0.3-True]",
        ],
        what="the audit's 200-step rule never flags a drift bias (only the early "
        "flag, beyond 4 standard errors, can)",
    ),
    dict(
        name="drift_bias_sign",
        file="cenlmc_jax/ensemble/audit.py",
        original="along = jnp.sum(jnp.where(ok, jnp.sum(err * grad_f, axis=-1), 0.0))",
        replacement="along = "
        "-jnp.sum(jnp.where(ok, jnp.sum(err * grad_f, axis=-1), 0.0))",
        tests=[
            "tests/ensemble/test_audit.py::test_a_scaled_force_gives_the_fraction_times_its_scale",
            "tests/ensemble/test_audit.py::test_the_audit_drift_bias_sees_and_predicts_the_fit_bias",
        ],
        what="the drift bias with its sign flipped (a weak force reported as strong)",
    ),
    dict(
        name="fd_value_reused_for_another_density",
        file="cenlmc_jax/gradients/ensemble.py",
        original="and inner == logdensity_fn\n",
        replacement="\n",
        tests=[
            "tests/gradients/test_finite_difference.py::"
            "test_a_finite_difference_of_another_density_never_gets_the_samplers_values"
        ],
        what="a finite difference of another log density is handed the sampler's "
        "values",
    ),
    dict(
        name="fd_forward_ignores_the_value",
        file="cenlmc_jax/gradients/finite_difference.py",
        original="return (shifted - value) / delta",
        replacement="return (shifted - jnp.mean(shifted)) / delta",
        tests=[
            "tests/gradients/test_finite_difference.py::"
            "test_value_and_grad_and_grad_given_value_are_the_gradient_with_no_value_twice[forward]",
            "tests/gradients/test_finite_difference.py::test_finite_difference_matches_the_exact_gradient[forward-2e-06]",
        ],
        what="the forward difference taken against the mean of the shifted values, not "
        "the point's value",
    ),
    dict(
        name="sharded_fit_columns_split",
        file="cenlmc_jax/ensemble/least_squares/__init__.py",
        original="in_specs=(P(axis), P())",
        replacement="in_specs=(P(axis), P(axis))",
        tests=[
            "tests/ensemble/test_least_squares_backends.py::test_the_sharded_fit_is_the_single_device_fit_bit_for_bit"
        ],
        what="under a mesh each device fits its rows against only its own columns",
    ),
    dict(
        name="hessian_of_a_loop_by_autodiff",
        file="cenlmc_jax/adaptation/newton.py",
        original='"autodiff" if small and not _has_loop(jaxpr) else',
        replacement='"autodiff" if small else',
        tests=[
            "tests/adaptation/test_newton.py::"
            "test_a_model_with_a_scan_gets_its_hessian_from_gradient_differences"
        ],
        what="a lax.scan model's Hessian by forward over reverse (issue 48: slow "
        "to compile)",
    ),
    dict(
        name="split_keys_prefix_without_partitionable_threefry",
        file="cenlmc_jax/_keys.py",
        original="if not jax.config.jax_threefry_partitionable:",
        replacement="if False:",
        tests=[
            "tests/test_keys.py::test_split_keys_are_the_keys_of_jax_random_split"
            "[typed-False]",
            "tests/test_keys.py::test_split_keys_are_the_keys_of_jax_random_split"
            "[legacy-False]",
        ],
        what="the one-split shortcut taken where a split's keys depend on the count "
        "(partitionable threefry off): other keys than jax.random.split's",
    ),
    dict(
        name="two_step_mala_short_step_probability_flipped",
        file="cenlmc_jax/adaptation/langevin_warmup.py",
        original="h = jnp.where(jax.random.uniform(k_pick) < p, small, step_size)",
        replacement="h = jnp.where(jax.random.uniform(k_pick) > p, small, step_size)",
        tests=[
            "tests/adaptation/test_kinetic.py::"
            "test_two_step_mala_is_exact_and_is_mala_without_a_small_step"
        ],
        what="the handed-over MALA takes its shorter step with probability 1 - p",
    ),
    dict(
        name="autostep_without_reverse_check",
        file="cenlmc_jax/irreversible/autostep.py",
        original="(x1, r1, v1, g1), agree=same",
        replacement="(x1, r1, v1, g1), agree=True",
        tests=[
            "tests/irreversible/test_autostep.py::"
            "test_autostep_is_reversible_on_a_small_case"
        ],
        what="AutoStep HMC accepts a move whose reverse selection picks another step",
    ),
    dict(
        name="autostep_never_halves",
        file="cenlmc_jax/irreversible/autostep.py",
        original="return (k < 0) | ((e <= log_a) & (k < halvings))",
        replacement="return (k < 0) | ((e < -jnp.inf) & (k < halvings))",
        tests=[
            "tests/irreversible/test_autostep.py::"
            "test_halvings_follow_the_step_and_grad_evals_count_them"
        ],
        what="AutoStep HMC keeps the step where its energy error says halve it",
    ),
    dict(
        name="autostep_threshold_inverted",
        file="cenlmc_jax/adaptation/adjusted.py",
        original="if hmc and stuck.mean() >= AUTOSTEP_MIN_STUCK:",
        replacement="if hmc and stuck.mean() < AUTOSTEP_MIN_STUCK:",
        tests=[
            "tests/adaptation/test_kinetic.py::"
            "test_stuck_particles_keep_their_place_and_autostep_is_handed_over"
        ],
        what="AutoStep HMC handed over where few particles are stuck, not where many",
    ),
    dict(
        name="autostep_halved_neck_blind",
        file="cenlmc_jax/irreversible/autostep.py",
        original="jnp.where(mu > 0, state.logdensity, jnp.zeros_like("
        "state.logdensity))",
        replacement="jnp.zeros_like(state.logdensity)",
        tests=[
            "tests/irreversible/test_autostep.py::"
            "test_halved_moves_that_start_at_high_density_flag_a_neck"
        ],
        what="AutoStep's halved moves never say where they start: a neck entered "
        "without divergences passes",
    ),
    dict(
        name="start_elbo_comparison_inverted",
        file="cenlmc_jax/adaptation/start.py",
        original="    if elbo_given > elbo_laplace + ELBO_MARGIN:",
        replacement="    if elbo_given < elbo_laplace + ELBO_MARGIN:",
        tests=[
            "tests/adaptation/test_laplace_start.py::"
            "test_a_laplace_start_with_the_lower_elbo_gives_way_to_the_given_positions",
            "tests/adaptation/test_laplace_start.py::"
            "test_a_gaussian_still_gets_the_laplace_start",
        ],
        what="the Laplace start refused where its ELBO is the higher, kept where lower",
    ),
    dict(
        name="positions_metric_inverted",
        file="cenlmc_jax/adaptation/start.py",
        original="np.sqrt(var / np.where(use, var_g, 1.0))",
        replacement="np.sqrt(np.where(use, var_g, 1.0) / var)",
        tests=[
            "tests/adaptation/test_laplace_start.py::"
            "test_the_positions_metric_is_a_gaussians_variance_wherever_the_positions_are"
        ],
        what="nutpie's metric for the given positions inverted (a precision, not a "
        "variance)",
    ),
    dict(
        name="stuck_particles_never_seen",
        file="cenlmc_jax/adaptation/adjusted.py",
        original="    stuck = (a < STUCK_ACCEPTANCE) | (div > 0)\n",
        replacement="    stuck = (a < 0.0) & (div < 0)\n",
        tests=[
            "tests/adaptation/test_kinetic.py::"
            "test_stuck_particles_keep_their_place_and_autostep_is_handed_over"
        ],
        what="particles stuck at the warm-up's HMC step: no AutoStep HMC handed over",
    ),
    dict(
        name="cpu_threads_threshold_off_by_one",
        file="cenlmc_jax/cli/jobs.py",
        original="or args.particles * dim > ONE_THREAD_MAX_COORDS",
        replacement="or args.particles * dim >= ONE_THREAD_MAX_COORDS",
        tests=[
            "tests/cli/test_cli.py::"
            "test_cpu_threads_sets_the_pool_before_the_backend_starts"
            "[auto-8192-2-None-1-1]"
        ],
        what="--cpu-threads auto leaves the pool at N d = 16,384, its stated bound",
    ),
    dict(
        name="online_mean_sq_from_the_first_half",
        file="cenlmc_jax/diagnostics/online.py",
        original="ess[d:], mean[d:], mcse[d:]",
        replacement="ess[d:], mean[:d], mcse[d:]",
        tests=[
            "tests/diagnostics/test_online.py::"
            "test_streamed_split_rhat_is_the_traces_split_rhat"
        ],
        what="the streamed mean of x^2 is the mean of x (one compiled finish)",
    ),
    dict(
        name="bonferroni_one_sided",
        file="cenlmc_jax/diagnostics/online.py",
        original="    p = false_alarm / (2.0 * max(int(num_tests), 1))\n",
        replacement="    p = false_alarm / max(int(num_tests), 1)\n",
        tests=[
            "tests/diagnostics/test_online.py::"
            "test_bonferroni_z_is_the_two_sided_normal_quantile"
        ],
        what="the step-halving check's threshold is a one-sided quantile (too low)",
    ),
    dict(
        name="pallas_width_one_too_many",
        file="cenlmc_jax/pairwise/pallas.py",
        original="    return max(16, 1 << (max(int(d), 1) - 1).bit_length())",
        replacement="    return max(16, 1 << max(int(d), 1).bit_length())",
        tests=[
            "tests/pairwise/test_pallas.py::test_padded_widths_are_pallas_powers_of_two"
        ],
        what="the kernel pads d = 16 to 32 lanes (computed without importing Pallas)",
    ),
    dict(
        name="neck_depth_sign_flipped",
        file="cenlmc_jax/irreversible/hmc.py",
        original="return (c[ok] - r[ok] * a[ok]) / np.sqrt(var[ok]), r[ok]",
        replacement="return (r[ok] * a[ok] - c[ok]) / np.sqrt(var[ok]), r[ok]",
        tests=[
            "tests/irreversible/test_hmc.py::test_neck_depth_is_the_mean_standardised"
            "_log_density_of_divergent_starts",
            "tests/irreversible/test_hmc.py::test_divergences_in_an_unfilled_neck_fail"
            "_and_at_a_bananas_tips_do_not",
        ],
        what="divergences at a banana's tips fail the run and a funnel's neck passes",
    ),
    dict(
        name="neck_depth_lower_without_its_error",
        file="cenlmc_jax/irreversible/hmc.py",
        original="    return depth - NECK_Z * se",
        replacement="    return depth",
        tests=[
            "tests/irreversible/test_hmc.py::test_neck_depth_lower_is_the_depth_less"
            "_two_batch_mean_standard_errors",
            "tests/irreversible/test_hmc.py::test_a_depth_from_a_few_divergent_moves"
            "_is_not_a_neck_and_from_many_it_is",
        ],
        what="the neck checks judge the point estimate: a depth read from a few "
        "dozen divergent moves fails a right run",
    ),
    dict(
        name="sample_until_progress_says_nothing",
        file="cenlmc_jax/run_until.py",
        original="diag = diag._replace(going_on=tuple(going_on))",
        replacement="diag = diag._replace(going_on=())",
        tests=[
            "tests/diagnostics/test_nested.py::test_sample_until_goes_on_while_a"
            "_declared_rate_rises",
            "tests/cli/test_cli_progress.py::test_progress_of_the_default_run_says_why"
            "_it_goes_on",
        ],
        what="--progress prints every check as if the verdict held while the run goes "
        "on",
    ),
    dict(
        name="memory_check_left_out",
        file="cenlmc_jax/diagnostics/nested.py",
        original="    if diag.half_corr is not None:",
        replacement="    if False:",
        tests=[
            "tests/diagnostics/test_nested.py::test_the_memory_check_fires_on_chains"
            "_slow_beside_the_window_only",
            "tests/diagnostics/test_nested.py::test_sample_until_does_not_stop_while_a"
            "_slow_direction_keeps_a_narrow_start",
        ],
        what="the verdict without the chains' memory against the window: the banana "
        "from a narrow hand-over stops after 50 moves, 3-4 MCSEs low",
    ),
    dict(
        name="half_correlation_of_one_half_with_itself",
        file="cenlmc_jax/diagnostics/nested.py",
        original="np.asarray(stats.chain_halves[i], np.float64) for i in (0, 1)",
        replacement="np.asarray(stats.chain_halves[i], np.float64) for i in (0, 0)",
        tests=[
            "tests/diagnostics/test_nested.py::test_half_correlation_matches_a_hand"
            "_worked_example",
        ],
        what="the memory statistic correlates a half with itself (always 1)",
    ),
    dict(
        name="sample_until_warns_every_segment",
        file="cenlmc_jax/run_until.py",
        original="_reemit(segment_warnings, _kept_flag_texts(infos[-1]))",
        replacement="_reemit(segment_warnings, set())",
        tests=[
            "tests/diagnostics/test_nested.py::test_sample_until_warns_of_a_kept_step"
            "_flag_once_on_its_window",
        ],
        what="a neck's warning printed once per segment of the run (6 times)",
    ),
    dict(
        name="verdict_reads_a_statistic_flag_as_a_plain_one",
        file="cenlmc_jax/cli/verdict.py",
        original="    if flag.statistic is not None:  # kept_only: a number of the "
        "kept",
        replacement="    if False:  # kept_only: a number of the kept",
        tests=[
            "tests/cli/test_cli_run_flags.py::test_a_statistic_flag_is_judged_on_the"
            "_kept_steps_by_driver_and_verdict[burn_in_only-False-None]",
            "tests/cli/test_cli_run_flags.py::test_a_statistic_flag_is_judged_on_the"
            "_kept_steps_by_driver_and_verdict[burn_in_only-False-mean]",
        ],
        what="the CLI fails every run with a divergence, wherever it starts",
    ),
    dict(
        name="flat_normal_reshaped_in_the_wrong_order",
        file="cenlmc_jax/_keys.py",
        original="return jax.random.normal(key, (size,), dtype).reshape(shape)",
        replacement="return jax.random.normal(key, (size,), dtype)"
        ".reshape(shape[::-1]).T",
        tests=[
            "tests/test_keys.py::test_normal_draws_the_numbers_of_jax_random_normal"
            "[True]",
            "tests/test_keys.py::test_normal_draws_the_numbers_of_jax_random_normal"
            "[False]",
        ],
        what="the Laplace start's and the momenta's draws silently change from JAX's",
    ),
    dict(
        name="superchain_starts_pushed_from_the_origin",
        file="cenlmc_jax/diagnostics/nested.py",
        original="pushed = (centre + overdispersion * (chosen - centre))"
        ".astype(x.dtype)",
        replacement="pushed = (overdispersion * chosen).astype(x.dtype)",
        tests=[
            "tests/test_keys.py::test_superchain_starts_are_those_of_the_eager_jax_code",
        ],
        what="superchains start pushed away from 0, not from the ensemble's mean",
    ),
]


def repo_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout.decode()
    return [p for p in out.split("\0") if p and (REPO / p).is_file()]


def make_copy(files: list[str], dest: Path) -> None:
    for rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, target)


def test_env(copy: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(copy) + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no stale bytecode between copies
    env.setdefault("JAX_PLATFORMS", "cpu")
    return env


def check_import_shadowing(copy: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import cenlmc_jax; print(cenlmc_jax.__file__)"],
        cwd=copy,
        env=test_env(copy),
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if not Path(out).resolve().is_relative_to(copy.resolve()):
        raise SystemExit(
            "the copy does not shadow the installed package: cenlmc_jax imported from "
            f"{out}"
        )


def node_key(classname: str, name: str) -> str:
    """JUnit (classname, name) -> pytest node id (tests/x.py::test[param])."""
    return classname.replace(".", "/") + ".py::" + name


def run_tests(copy: Path, tests: list[str], timeout: float) -> tuple[dict, float, str]:
    """Run ``tests`` in ``copy``; per-test outcome ('passed', 'failed', 'error',
    'skipped', 'missing')."""
    report = copy / "_mutation_junit.xml"
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "--full",  # a catching test may sit in the slow tier (conftest.SLOW)
                f"--junitxml={report}",
                *tests,
            ],
            cwd=copy,
            env=test_env(copy),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        tail = (proc.stdout + proc.stderr)[-3000:]
    except subprocess.TimeoutExpired as exc:
        tail = f"timeout after {timeout} s\n" + str(exc.stdout or "")[-2000:]
    seconds = time.perf_counter() - t0
    outcomes: dict[str, str] = {}
    durations: dict[str, float] = {}
    messages: dict[str, str] = {}
    if report.exists():
        for case in ET.parse(report).getroot().iter("testcase"):
            key = node_key(case.get("classname", ""), case.get("name", ""))
            kinds = {child.tag: child for child in case}
            outcome = (
                "failed"
                if "failure" in kinds
                else "error"
                if "error" in kinds
                else "skipped"
                if "skipped" in kinds
                else "passed"
            )
            outcomes[key] = outcome
            durations[key] = float(case.get("time", "nan"))
            bad = kinds.get("failure", kinds.get("error"))
            # why it failed: the assertion's first line (a crash would show here too)
            if bad is not None:
                messages[key] = (
                    (bad.get("message") or "").splitlines()[0][:160]
                    if bad.get("message")
                    else ""
                )
    result = {}
    for t in tests:
        hits = {k: v for k, v in outcomes.items() if k == t or k.startswith(t + "[")}
        if not hits:
            result[t] = {"outcome": "missing", "seconds": None}
        else:  # a parametrised id without brackets: failed if any instance failed
            worst = (
                "error"
                if "error" in hits.values()
                else "failed"
                if "failed" in hits.values()
                else "passed"
                if "passed" in hits.values()
                else "skipped"
            )
            result[t] = {
                "outcome": worst,
                "seconds": round(sum(durations[k] for k in hits), 2),
                "message": "; ".join(messages[k] for k in hits if k in messages),
            }
    return result, seconds, tail


def apply_mutation(copy: Path, m: dict) -> None:
    path = copy / m["file"]
    text = path.read_text()
    count = text.count(m["original"])
    if count != 1:
        raise SystemExit(
            f"{m['name']}: the original text occurs {count} times in {m['file']} (need "
            f"exactly 1): {m['original']!r}"
        )
    path.write_text(text.replace(m["original"], m["replacement"]))


def markdown(payload: dict) -> str:
    lines = [
        "# Mutation check",
        "",
        f"Generated by `benchmarks/mutation_check.py` on {payload['machine']['date']} "
        f"({payload['machine']['platform']}, {payload['machine']['cpu_count']} CPUs, "
        f"git {payload['git_head'][:10]}"
        f"{' + uncommitted edits' if payload['dirty'] else ''}).",
        "",
        "Each mutation is applied to a temporary copy of the working tree; it is "
        "*caught* when every listed test fails. Baseline (no mutation): "
        + ("all listed tests pass" if payload["baseline"]["ok"] else "**FAILED**")
        + f" ({payload['baseline']['seconds']:.0f} s).",
        "",
        "| mutation | file | original | replacement | tests (outcome under the "
        "mutation) | result | time | why they failed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    esc = lambda s: s.strip().replace("|", "\\|").replace("\n", " ")  # noqa: E731
    for m in payload["mutations"]:
        tests = "<br>".join(
            f"`{t.split('::')[-1]}`: {r['outcome']}" for t, r in m["tests"].items()
        )
        why = "<br>".join(
            esc(r.get("message") or "")[:120] for r in m["tests"].values()
        )
        lines.append(
            f"| {m['name']} ({m['what']}) | `{m['file']}` | `{esc(m['original'])}` | "
            f"`{esc(m['replacement'])}` | {tests} | "
            f"{'caught' if m['caught'] else '**MISSED**'} | {m['seconds']:.0f} s | "
            f"{why} |"
        )
    lines += [
        "",
        "Baseline timings of the tests (pytest's call time, one process, compile "
        "included):",
        "",
        "| test | outcome | seconds |",
        "|---|---|---|",
    ]
    for t, r in payload["baseline"]["tests"].items():
        lines.append(f"| `{t}` | {r['outcome']} | {r['seconds']} |")
    n_caught = sum(m["caught"] for m in payload["mutations"])
    lines += ["", f"{n_caught} of {len(payload['mutations'])} mutations caught."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=" ".join(__doc__.split("\n\n")[0].split())
    )
    parser.add_argument("--only", nargs="*", help="run only these mutations (by name)")
    parser.add_argument("--out-dir", default=str(HERE / "results"))
    parser.add_argument(
        "--timeout", type=float, default=1800.0, help="seconds per pytest run"
    )
    args = parser.parse_args()
    mutations = [m for m in MUTATIONS if not args.only or m["name"] in args.only]
    if args.only and len(mutations) != len(set(args.only)):
        raise SystemExit(
            f"unknown mutation in {args.only}; known: {[m['name'] for m in MUTATIONS]}"
        )

    files = repo_files()
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    dirty = bool(
        subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    all_tests = list(dict.fromkeys(t for m in mutations for t in m["tests"]))
    payload = {
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "date": _dt.datetime.now().isoformat(timespec="seconds"),
        },
        "git_head": head,
        "dirty": dirty,
        "mutations": [],
    }
    with tempfile.TemporaryDirectory(prefix="cenlmc_mutation_") as tmp:
        snapshot = Path(tmp) / "snapshot"
        make_copy(files, snapshot)  # one snapshot: every mutation sees the same tree
        base = Path(tmp) / "baseline"
        shutil.copytree(snapshot, base)
        check_import_shadowing(base)
        print(f"baseline: {len(all_tests)} tests", flush=True)
        res, secs, tail = run_tests(base, all_tests, args.timeout)
        ok = all(r["outcome"] == "passed" for r in res.values())
        payload["baseline"] = {"ok": ok, "seconds": round(secs, 1), "tests": res}
        print(f"baseline: {'ok' if ok else 'FAILED'} in {secs:.0f} s", flush=True)
        if not ok:
            print(tail)
        shutil.rmtree(base)
        for m in mutations:
            copy = Path(tmp) / m["name"]
            shutil.copytree(snapshot, copy)
            apply_mutation(copy, m)
            res, secs, tail = run_tests(copy, m["tests"], args.timeout)
            caught = all(r["outcome"] in ("failed", "error") for r in res.values())
            payload["mutations"].append(
                {**m, "tests": res, "caught": caught, "seconds": round(secs, 1)}
            )
            print(
                f"{m['name']}: {'caught' if caught else 'MISSED'} in {secs:.0f} s "
                f"({', '.join(r['outcome'] for r in res.values())})",
                flush=True,
            )
            if any(r["outcome"] in ("error", "missing") for r in res.values()):
                print(tail)
            shutil.rmtree(copy)

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "mutations.json").write_text(
        json.dumps(payload, indent=2, ensure_ascii=False) + "\n"
    )
    (out / "mutations.md").write_text(markdown(payload))
    missed = [m["name"] for m in payload["mutations"] if not m["caught"]]
    print(
        f"wrote {out / 'mutations.json'} and {out / 'mutations.md'}; missed: "
        f"{missed or 'none'}"
    )
    return 1 if missed or not payload["baseline"]["ok"] else 0


if __name__ == "__main__":
    sys.exit(main())
