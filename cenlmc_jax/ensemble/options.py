"""How EnLMC and CEnLMC compute a step: the options bundle, written once.

None of these options changes the algorithm (the law of the chain, up to
rounding): they choose how the pair force and the gradients are computed, and
the gradient audit's size. They are one frozen :class:`EnsembleOptions`
(a NamedTuple: hashable when its members are, a static argument of
``jax.jit``), which every entry point takes either whole (``options=``) or as
keywords of its fields::

    cj.cenlmc(
        logdensity_fn, 0.05, 0.3, 0.5, 0.3, 20, 10.0, grad_capacity=64, method="tiled"
    )
    cj.cenlmc(
        logdensity_fn, 0.05, 0.3, 0.5, 0.3, 20, 10.0,
        options=cj.ensemble.EnsembleOptions(grad_capacity=64, method="tiled"),
    )

The algorithm's own parameters (``step_size``, ``eta``, ``r1``, ``r2``,
``n_star``, ``m_f``, ``f_star``; EnLMC's ``blowup_factor``, CEnLMC's guard
``min_ball_neighbours``) stay explicit arguments of each sampler.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

from cenlmc_jax._validation import check_bool, check_callable, check_choice, check_int
from cenlmc_jax.gradients.modes import check_grad_mode
from cenlmc_jax.pairwise import METHODS, STRATEGIES
from cenlmc_jax.pairwise.algebra import canonical_precision

__all__ = ["EnsembleOptions", "ensemble_options"]


class EnsembleOptions(NamedTuple):
    """How an ensemble step is computed (module docstring); every field has a default.

    Attributes:
      grad_capacity: gradient buffer size in ``[1, N]``; None (default): one
        gradient call per step sized to the next of ``GRAD_BUCKETS`` = 8 fractions
        of N above the number of particles that need a gradient
        (:func:`cenlmc_jax.ensemble.buffers.needed_grads`).
      dense_grad: debugging switch: compute all N gradients, then select (same
        trajectory, no saving).
      method: passed to :func:`cenlmc_jax.pairwise.ensemble_force`.
      block_size: passed to :func:`cenlmc_jax.pairwise.ensemble_force`.
      precision: passed to :func:`cenlmc_jax.pairwise.ensemble_force`.
      mesh: a 1-D device mesh: the pair force runs sharded over it
        (``ensemble_force(..., mesh=mesh, strategy=strategy)``), and each device
        computes the true gradients of its own N/P particles, with buffers of
        ``ceil(grad_capacity / P)`` or the buckets of N/P
        (:func:`cenlmc_jax.ensemble.buffers.sharded_needed_grads`: the same
        gradients; ``info.grad_evals_padded`` is then the sum of the per-device
        buckets). The run is the unsharded one up to floating-point reduction
        order, not bit for bit: the first step equal, the first 10 steps' traces
        within 2e-5 (float32) / 5e-14 (float64) at unit scale, long runs equal
        in distribution (docs/guide/checkpoints.md, tests/test_sharded_runs.py).
        ``method="dense"`` has no sharded form and is refused with a mesh.
      strategy: the sharded pair force's ``"allgather"`` or ``"ring"``.
      block_sparse: passed to :func:`cenlmc_jax.pairwise.ensemble_force`
        (``None``: its ``auto`` rule; True / False force the block-sparse tile
        skipping on or off).
      audit_size: particles audited per step (true gradients at random particles
        that used the ensemble force; :mod:`cenlmc_jax.ensemble.audit`); 0
        switches the audit off; None: the sampler's default (EnLMC 32, CEnLMC
        :data:`~cenlmc_jax.ensemble.audit.CENLMC_AUDIT_SIZE`).
      grad_fn: ``x: (d,) -> ∇ log density (d,)`` for the particles that need a
        true gradient (an adjoint solver,
        :func:`cenlmc_jax.gradients.finite_difference`, an external code); default
        the autodiff gradient of ``logdensity_fn`` in ``grad_mode``. A ``grad_fn``
        overrides ``grad_mode``.
      interpret: the Pallas kernel's mode (``method="pallas"`` only): None
        (default) by the platform the step is lowered for (Triton on CUDA/ROCm,
        interpret mode elsewhere), True / False force it
        (:func:`cenlmc_jax.pairwise.ensemble_force`).
      grad_mode: ``"auto"`` (default), ``"reverse"`` or ``"forward"``: how the
        true gradients (of the particles that need one, and the audit's) are
        differentiated without ``grad_fn`` (:mod:`cenlmc_jax.gradients.modes`;
        auto: forward for ``d <= FORWARD_MAX_D``, the crossover of
        benchmarks/results/grad_mode.md). The same chain up to rounding either way.
      lookahead: CEnLMC only: evaluate the moved particles' values and the next
        step's gradients of the particles that will need one in ONE model call
        (:func:`cenlmc_jax.ensemble.cenlmc.cenlmc_step`, "Lookahead"). None
        (default): on where it applies (the paper's estimator; a ``grad_fn`` with
        ``values_and_grads``
        that shares the sampler's values, e.g.
        :func:`cenlmc_jax.gradients.finite_difference` of ``logdensity_fn``; the
        default buckets; no mesh; not ``dense_grad``); False: off (two calls a
        step); True: on, and a ``ValueError`` where it does not apply. The same
        chain either way (up to the rounding of values computed in JAX).
    """

    grad_capacity: int | None = None
    dense_grad: bool = False
    method: str = "auto"
    block_size: int | None = None
    precision: Any = None
    mesh: Any = None
    strategy: str = "allgather"
    block_sparse: bool | None = None
    audit_size: int | None = None
    grad_fn: Callable | None = None
    interpret: bool | None = None
    grad_mode: str = "auto"
    lookahead: bool | None = None

    def checked(self) -> EnsembleOptions:
        """The checks that need no ensemble (Python, before tracing).

        Returns:
          ``self``.

        Raises:
          ValueError: a field out of range or of the wrong kind.
        """
        if self.grad_capacity is not None:
            check_int(self.grad_capacity, "grad_capacity", minimum=1)
        check_bool(self.dense_grad, "dense_grad")
        check_choice(self.method, "method", METHODS)
        check_choice(self.strategy, "strategy", STRATEGIES)
        if self.block_size is not None:
            check_int(self.block_size, "block_size", minimum=1)
        if self.block_sparse is not None:
            check_bool(self.block_sparse, "block_sparse")
        if self.interpret is not None:
            check_bool(self.interpret, "interpret")
        if self.audit_size is not None:
            check_int(self.audit_size, "audit_size", minimum=0)
        if self.grad_fn is not None:
            check_callable(
                self.grad_fn, "grad_fn", "x: (d,) -> gradient of the log density (d,)"
            )
        check_grad_mode(self.grad_mode)
        if self.lookahead is not None:
            check_bool(self.lookahead, "lookahead")
        # the pair force's own checks, here so that they come before any work
        canonical_precision(self.precision)
        if self.mesh is not None and not isinstance(self.mesh, jax.sharding.Mesh):
            raise ValueError(
                "mesh must be a jax.sharding.Mesh (cj.pairwise.make_mesh()) or None; "
                f"got {type(self.mesh).__name__} {self.mesh!r}."
            )
        if self.mesh is not None and self.method == "dense":
            raise ValueError(
                "mesh= with method='dense': the dense reference has no sharded form; "
                "expected method 'auto', 'tiled' or 'pallas' with a mesh (or no mesh "
                f"with 'dense'); got method='dense', mesh={self.mesh!r}."
            )
        if self.block_sparse and self.method == "dense":
            raise ValueError(
                "block_sparse=True needs method 'auto', 'tiled' or 'pallas' (the dense "
                "reference has no block-sparse form); got method 'dense'."
            )
        return self

    def capacity(self, n: int) -> int | None:
        """The gradient buffer size for ``n`` particles.

        Args:
          n: the number of particles.

        Returns:
          ``grad_capacity`` (None: one bucketed call per step).

        Raises:
          ValueError: ``grad_capacity > n``.
        """
        if self.grad_capacity is None:
            return None
        return check_int(
            self.grad_capacity, "grad_capacity", minimum=1, maximum=n, why=f"N = {n}"
        )

    def audit(self, n: int, default: int) -> int:
        """Particles audited per step for ``n`` particles (at most n).

        Args:
          n: the number of particles.
          default: the sampler's default audit size.

        Returns:
          The audit size.
        """
        size = default if self.audit_size is None else self.audit_size
        return min(check_int(size, "audit_size", minimum=0), n)

    def force_kwargs(self) -> dict:
        """The keywords of :func:`cenlmc_jax.pairwise.ensemble_force` these options set.

        Returns:
          A dict of keyword arguments.
        """
        return dict(
            method=self.method,
            block_size=self.block_size,
            precision=self.precision,
            mesh=self.mesh,
            strategy=self.strategy,
            block_sparse=self.block_sparse,
            interpret=self.interpret,
        )


def ensemble_options(
    options: EnsembleOptions | None = None, **fields: Any
) -> EnsembleOptions:
    """``options`` (default ``EnsembleOptions()``) with ``fields`` replaced, checked.

    Args:
      options: an :class:`EnsembleOptions`, or None.
      **fields: fields to replace.

    Returns:
      The checked :class:`EnsembleOptions`.

    Raises:
      ValueError: ``options`` of another type, an unknown keyword (naming it and
        the known ones: a misspelt option never passes silently), or a field out
        of range.
    """
    if options is None:
        options = EnsembleOptions()
    elif not isinstance(options, EnsembleOptions):
        raise ValueError(
            "options must be a cenlmc_jax.ensemble.EnsembleOptions or None; got "
            f"{type(options).__name__}."
        )
    unknown = sorted(set(fields) - set(EnsembleOptions._fields))
    if unknown:
        raise ValueError(
            f"unknown ensemble option(s) {', '.join(unknown)}; the options are "
            f"{', '.join(EnsembleOptions._fields)} "
            "(cenlmc_jax.ensemble.EnsembleOptions)."
        )
    return options._replace(**fields).checked()
