"""Matrix pieces shared by the recipe family, SGRHMC and the SDE proposals.

One convention for every matrix argument (``D``, ``Q``, ``B_hat``, friction,
metrics): a :data:`MatrixLike` is

* a scalar ``c``, meaning ``c·I``;
* a ``(d,)`` vector, meaning ``diag(v)``;
* a ``(d, d)`` array;
* or a callable ``z -> M(z)`` returning one of the above (a position-dependent
  matrix).

:func:`evaluate` returns the value at a point in its own form (scalars and
diagonals stay cheap); :func:`to_dense` makes it ``(d, d)``. The checks
(:func:`check_symmetric_psd`, :func:`check_skew`) use one tolerance, relative
to the size of the matrix: ``eig_tol(d) = 100·d·ε_float32`` (``eigh``'s
backward error is ``O(d·ε·|A|)``, and float32 rounding is the worst a user's
matrix carries); positive *definiteness* is tested scale-invariantly, on the
matrix scaled by its diagonal, with ``100·d·ε`` of the matrix's own dtype
(``_check_definite``).

Also here: ``Γ_i(z) = Σ_j ∂_{z_j}(D_ij + s·Q_ij)`` by autodiff (docs/algorithms.md §5,
8) and a symmetric PSD square root with a derivative that stays finite at repeated
eigenvalues.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cenlmc_jax._validation import (
    check_function,
    check_output,
    is_concrete,
    raise_as_own,
)
from cenlmc_jax.types import Array, ArrayLike

__all__ = [
    "MatrixLike",
    "evaluate",
    "to_dense",
    "matvec",
    "is_constant",
    "check_matrix_shape",
    "check_matrix_form",
    "concrete_value",
    "constant_dense",
    "gamma_term",
    "psd_sqrt",
    "noise_root",
    "np_psd_sqrt",
    "eig_tol",
    "check_symmetric_psd",
    "check_skew",
    "check_noise_cov",
]

MatrixLike = ArrayLike | Callable[[Array], ArrayLike]


def eig_tol(n: int) -> float:
    """Relative tolerance for "clearly not symmetric / not PSD": ``100·n·ε_float32``.

    Args:
      n: the matrix's dimension.

    Returns:
      The tolerance, a Python float, relative to the size of the matrix.
    """
    return 100.0 * n * float(np.finfo(np.float32).eps)


def is_constant(M: Any) -> bool:
    """Whether ``M`` is a constant (not callable) matrix with a concrete value.

    Args:
      M: a :data:`MatrixLike` or None.

    Returns:
      True when ``M`` is not None, not callable and concrete (not a tracer).
    """
    return M is not None and not callable(M) and is_concrete(M)


def check_matrix_shape(m: Any, name: str, d: int) -> None:
    """Checks that ``m`` is a scalar, a ``(d,)`` diagonal or a ``(d, d)`` matrix.

    Args:
      m: a matrix value (array-like).
      name: the argument's name, for the error message.
      d: the position's dimension.

    Raises:
      ValueError: any other shape.
    """
    shape = tuple(np.shape(m))
    if shape not in ((), (d,), (d, d)):
        raise ValueError(
            f"{name} must be a scalar (c·I), a ({d},) diagonal or a ({d}, {d}) matrix "
            f"for a position of dimension {d}; got shape {shape}."
        )


def check_matrix_form(M: Any, name: str) -> None:
    """Checks a :data:`MatrixLike` before the dimension is known.

    It must be a callable, or a finite constant scalar, vector or square matrix.

    Args:
      M: the matrix argument as the user gave it.
      name: the argument's name, for the error message.

    Raises:
      ValueError: None, a string, more than 2 dimensions, a non-square matrix, a
        non-numeric dtype or a non-finite entry.
    """
    if callable(M):
        return
    if M is None or isinstance(M, (str, bytes)):
        raise ValueError(
            f"{name} must be a scalar, a (d,) diagonal, a (d, d) matrix or a callable; "
            f"got {M!r}."
        )
    if not is_concrete(M):
        return
    m = np.asarray(M)
    if (
        m.ndim > 2
        or (m.ndim == 2 and m.shape[0] != m.shape[1])
        or not np.issubdtype(m.dtype, np.number)
    ):
        raise ValueError(
            f"{name} must be a scalar, a (d,) diagonal, a (d, d) matrix or a callable; "
            f"got shape {m.shape}, dtype {m.dtype}."
        )
    _finite(np.asarray(m, np.float64), name)


def concrete_value(M: Any, z: Array, name: str) -> Any:
    """The value of a :data:`MatrixLike` at ``z`` when it can be known in Python.

    A callable is called only at a concrete ``z`` (an exception in it is raised
    again as its own type, naming it); a traced value is unknown.

    Args:
      M: a :data:`MatrixLike` or None.
      z: the position, shape ``(d,)``.
      name: the argument's name, for error messages.

    Returns:
      ``M`` (or ``M(z)``) when every leaf is concrete, else None.

    Raises:
      ValueError: a callable ``M`` whose output has the wrong shape or kind.
      Exception: what a callable ``M`` raised at ``z``, as its own type.
    """
    if M is None:
        return None
    if callable(M):
        check_matrix_fn(M, z, name)
        if not is_concrete(z):
            return None
        try:
            M = M(z)
        except Exception as exc:  # the user's matrix function: its own exception
            raise_as_own(
                exc,
                f"{name} raised {type(exc).__name__} on a position of shape "
                f"{tuple(z.shape)}",
            )
    if not all(is_concrete(leaf) for leaf in jax.tree_util.tree_leaves(M)):
        return None
    return M


def matrix_what(d: int) -> str:
    return (
        f"position -> a matrix: a scalar (c·I), a ({d},) diagonal or a ({d}, {d}) "
        "matrix"
    )


def check_matrix_fn(M: Any, z: Array, name: str) -> None:
    """A callable matrix, checked abstractly at a point shaped like ``z``.

    By ``jax.eval_shape`` (the one output check of :mod:`cenlmc_jax._validation`);
    constants are left to :func:`check_matrix_shape`.
    """
    if callable(M):
        d = z.shape[-1]
        check_function(
            M, name, (z,), what=matrix_what(d), shapes=((), (d,), (d, d)), kind="real"
        )


def evaluate(M: MatrixLike, z: Array, name: str = "matrix") -> Array:
    """``M(z)`` for a callable, else ``M``, as an array in ``z``'s dtype.

    Args:
      M: a :data:`MatrixLike`.
      z: the position, shape ``(d,)``.
      name: the argument's name, for error messages.

    Returns:
      The value, shape ``()``, ``(d,)`` or ``(d, d)``, in ``z``'s dtype.
    """
    d = z.shape[-1]
    if callable(M):
        out = M(z)
        check_output(
            out, name, what=matrix_what(d), shapes=((), (d,), (d, d)), kind="real"
        )
    else:
        out = M
    m = jnp.asarray(out, z.dtype)
    check_matrix_shape(m, name, d)
    return m


def to_dense(m: Array, d: int) -> Array:
    """A scalar, diagonal or matrix value as a dense ``(d, d)`` array.

    Args:
      m: a value of :func:`evaluate`, shape ``()``, ``(d,)`` or ``(d, d)``.
      d: the dimension.

    Returns:
      The ``(d, d)`` array (``m·I``, ``diag(m)`` or ``m``).
    """
    if m.ndim == 0:
        return m * jnp.eye(d, dtype=m.dtype)
    if m.ndim == 1:
        return jnp.diag(m)
    return m


def constant_dense(M: ArrayLike, d: int) -> np.ndarray:
    """A concrete constant :data:`MatrixLike` as a float64 ``(d, d)`` NumPy array.

    Args:
      M: a concrete scalar, ``(d,)`` diagonal or ``(d, d)`` matrix.
      d: the dimension.

    Returns:
      The dense float64 ``(d, d)`` NumPy array.
    """
    m = np.asarray(M, np.float64)
    if m.ndim == 0:
        return float(m) * np.eye(d)
    if m.ndim == 1:
        return np.diag(m)
    return m


def matvec(m: Array, x: Array) -> Array:
    """``m @ x`` for a scalar, diagonal or dense ``m``.

    Args:
      m: shape ``()``, ``(d,)`` or ``(d, d)``.
      x: the vector, shape ``(d,)``.

    Returns:
      The product, shape ``(d,)``.
    """
    return m @ x if m.ndim == 2 else m * x


def gamma_term(
    D: MatrixLike | None,
    Q: MatrixLike | None,
    z: Array,
    sign: Any = 1.0,
    *,
    has_aux: bool = False,
) -> Any:
    """``Γ_i(z) = Σ_j ∂_{z_j} (D_ij(z) + sign·Q_ij(z))``, shape ``(d,)``.

    See docs/algorithms.md §5 and 8. Constant matrices have zero divergence and are
    not differentiated; when both are constant (or None) the result is zeros. A
    callable returning a scalar ``c(z)`` (``c·I``) or a diagonal ``v(z)`` contributes
    ``∂_i c`` or ``∂_i v_i``.

    Args:
      D: the diffusion matrix, a :data:`MatrixLike` or None.
      Q: the skew-symmetric curl matrix, a :data:`MatrixLike` or None.
      z: the point, shape ``(d,)``.
      sign: multiplies ``Q``'s divergence; ``sign = -1`` gives the adjoint
        process' ``Γ_-`` (section 8).
      has_aux: each callable returns ``(matrix, aux)`` (as for
        ``jax.jacfwd(..., has_aux=True)``): values computed at ``z`` on the way (a
        matrix root, say) come out of the same forward pass as the derivative
        instead of a second evaluation.

    Returns:
      ``Γ``, shape ``(d,)``; with ``has_aux=True``, ``(Γ, (aux_D, aux_Q))``, an
      aux being ``None`` for a matrix that is not callable.
    """
    gamma = jnp.zeros(z.shape, z.dtype)
    auxes = []
    for M, s in ((D, 1.0), (Q, sign)):
        if not callable(M):
            auxes.append(None)
            continue
        # jacfwd: d forward passes; jac[..., k] = ∂_{z_k} M(z) (the lambdas run in
        # this iteration: noqa B023)
        if has_aux:
            jac, aux = jax.jacfwd(
                lambda y: _matrix_and_aux(M(y), y.dtype),  # noqa: B023
                has_aux=True,
            )(z)
        else:
            jac, aux = jax.jacfwd(lambda y: jnp.asarray(M(y), y.dtype))(z), None  # noqa: B023
        auxes.append(aux)
        if jac.ndim == 1:  # scalar c(z)·I: row i's divergence is ∂_i c
            div = jac
        elif jac.ndim == 2:  # diagonal v(z): ∂_i v_i
            div = jnp.diagonal(jac)
        else:  # (d, d): trace over (j, k) of ∂_k M_ij
            div = jnp.einsum("ijj->i", jac)
        gamma = gamma + s * div.astype(z.dtype)
    return (gamma, tuple(auxes)) if has_aux else gamma


def _matrix_and_aux(out: Any, dtype) -> tuple[Array, Any]:
    matrix, aux = out
    return jnp.asarray(matrix, dtype), aux


@jax.custom_jvp
def psd_sqrt(a: Array) -> Array:
    """Symmetric PSD square root ``S = V diag(sqrt(max(w, 0))) Vᵀ``.

    Eigenvalues below 0 (rounding) are clipped. The derivative is not eigh's
    (which divides by eigenvalue gaps and is NaN at repeated eigenvalues, e.g.
    any metric ``c(θ)·I``): it solves the Sylvester equation
    ``S dS + dS S = dA`` in the eigenbasis, ``dS'_ij = dA'_ij / (s_i + s_j)``,
    finite whenever ``s_i + s_j > 0``. Where both vanish the square root is
    genuinely not differentiable and the derivative is ±inf (0 for a zero
    tangent), so a singular ``Γ`` shows up as non-finite values, not silence.

    Args:
      a: a symmetric matrix, shape ``(n, n)`` (symmetrised before use).

    Returns:
      ``S``, shape ``(n, n)``, symmetric PSD with ``S S ≈ a``.
    """
    a = 0.5 * (a + a.T)
    w, v = jnp.linalg.eigh(a)
    return (v * jnp.sqrt(jnp.clip(w, 0.0))) @ v.T


@psd_sqrt.defjvp
def _psd_sqrt_jvp(primals, tangents):
    (a,), (da,) = primals, tangents
    a = 0.5 * (a + a.T)
    da = 0.5 * (da + da.T)
    w, v = jnp.linalg.eigh(a)
    s = jnp.sqrt(jnp.clip(w, 0.0))
    out = (v * s) @ v.T
    dap = v.T @ da @ v
    denom = s[:, None] + s[None, :]
    dsp = jnp.where(dap == 0, jnp.zeros_like(dap), dap / denom)
    return out, v @ dsp @ v.T


def noise_root(cov: Array, scale: Array) -> tuple[Array, Array]:
    """PSD root of a noise covariance and whether it was clearly negative.

    The traced path (for constant matrices see :func:`np_psd_sqrt`).

    Args:
      cov: the noise covariance, shape ``(n, n)``.
      scale: size of the terms ``cov`` was computed from (cancellation error is
        relative to it).

    Returns:
      ``(root, clipped)``: the PSD root, shape ``(n, n)``, and a boolean scalar,
      True when an eigenvalue was below ``-eig_tol(n)·scale``.
    """
    cov = 0.5 * (cov + cov.T)
    w, v = jnp.linalg.eigh(cov)
    clipped = jnp.min(w) < -eig_tol(cov.shape[0]) * scale
    return (v * jnp.sqrt(jnp.clip(w, 0.0))) @ v.T, clipped


def np_psd_sqrt(a: np.ndarray) -> np.ndarray:
    """:func:`psd_sqrt` in float64 NumPy, for constant matrices.

    Taken once, outside the trace.

    Args:
      a: a symmetric matrix, shape ``(n, n)``.

    Returns:
      The symmetric PSD root, a NumPy ``(n, n)`` array.
    """
    w, v = np.linalg.eigh(0.5 * (a + a.T))
    return (v * np.sqrt(np.clip(w, 0.0, None))) @ v.T


def _finite(m: np.ndarray, name: str) -> None:
    if not np.all(np.isfinite(m)):
        raise ValueError(
            f"{name} must be finite; got a matrix with NaN or inf entries."
        )


def check_symmetric_psd(
    m: Any, name: str, what: str, *, scale: float | None = None, definite: bool = False
) -> None:
    """Checks that the concrete ``(n, n)`` matrix ``m`` is symmetric PSD.

    PSD: positive semidefinite.

    Args:
      m: the concrete matrix, shape ``(n, n)``.
      name: its name, for the error message.
      what: what it is for, for the error message.
      scale: the size of the terms ``m`` was computed from (default ``max|m|``);
        for ``ε(2D - εB̂)`` the cancellation error is relative to ``|2εD|``, not
        to the (possibly zero) result.
      definite: ask for positive definite (a Gaussian density needs it).

    Raises:
      ValueError: ``m`` is not finite, not symmetric, or not positive
        semidefinite (definite) within the tolerance.
    """
    eps = _eps_of(m)
    m = np.asarray(m, dtype=np.float64)
    _finite(m, name)
    n = m.shape[0]
    size = max(float(np.max(np.abs(m))) if m.size else 0.0, np.finfo(np.float64).tiny)
    scale = size if scale is None else max(scale, np.finfo(np.float64).tiny)
    asym = float(np.max(np.abs(m - m.T)))
    if asym > eig_tol(n) * size:
        raise ValueError(
            f"{name} must be symmetric ({what}); max |{name} - {name}ᵀ| = {asym:.4g} "
            f"(max |{name}| = {size:.4g})."
        )
    lam_min = float(np.linalg.eigvalsh(0.5 * (m + m.T)).min())
    if definite:
        _check_definite(0.5 * (m + m.T), name, what, lam_min, eps)
    if lam_min < -eig_tol(n) * scale:
        raise ValueError(
            f"{name} must be positive semidefinite ({what}); its smallest eigenvalue "
            f"is {lam_min:.4g} (scale of the matrix {scale:.4g})."
        )


def _eps_of(m: Any) -> float:
    """Machine epsilon of the dtype ``m`` is used in.

    The coarser of its own floating dtype (JAX's default float for a list or an
    integer array) and JAX's default float (float32 unless ``jax_enable_x64``: a
    float64 array is then computed in float32).
    """
    dtype = getattr(m, "dtype", None)
    default = jnp.result_type(float)
    if dtype is None or not np.issubdtype(dtype, np.floating):
        dtype = default
    return max(float(np.finfo(dtype).eps), float(np.finfo(default).eps))


def _check_definite(
    m: np.ndarray, name: str, what: str, lam_min: float, eps: float
) -> None:
    """Positive definite, tested scale-invariantly.

    The diagonal must be positive, and the smallest eigenvalue of the diagonally
    scaled ``C = S m S`` (``S = diag(m)^{-1/2}``, a correlation matrix:
    ``C_ii = 1``, ``λ(C) ≤ n``) above ``100·n·ε`` of the dtype the matrix is used
    in.

    ``m`` is positive definite iff ``C`` is (a congruence), and ``C`` does not change
    when the coordinates are rescaled, so a diagonal such as
    ``(34.8, 3.6e-3, 8.9e-4)`` (the adapted variances of a raw-scale regression,
    condition number 4·10⁴) passes, as it must: its ``C`` is the identity. A test on
    ``λ_min(m)`` relative to ``max|m|`` refused every condition number above
    ``1/(100·n·ε_float32)`` ≈ 8.4·10⁴/n, even in float64. What stays refused is a
    ``C`` whose smallest eigenvalue is at rounding level: a Cholesky factorisation
    in that dtype could fail or lose all digits (``eigh``'s backward error is
    ``O(n·ε·|C|)``).
    """
    diag = np.diag(m)
    if not np.all(diag > 0):
        k = int(np.argmin(diag))
        raise ValueError(
            f"{name} must be positive definite ({what}); its diagonal entry "
            f"{name}[{k}, {k}] is {diag[k]:.4g} (the smallest eigenvalue is "
            f"{lam_min:.4g})."
        )
    root = 1.0 / np.sqrt(diag)
    corr = root[:, None] * m * root[None, :]
    corr_min = float(np.linalg.eigvalsh(corr).min())
    tol = 100.0 * m.shape[0] * eps
    if not corr_min > tol:
        raise ValueError(
            f"{name} must be positive definite ({what}); scaled by its diagonal "
            "(diag(m)^-1/2 m diag(m)^-1/2), its smallest eigenvalue is "
            f"{corr_min:.4g}, at or below the rounding level {tol:.3g} of its dtype "
            f"(the smallest eigenvalue of {name} itself is {lam_min:.4g})."
        )


def check_skew(m: Any, name: str, what: str) -> None:
    """Checks that the concrete ``(n, n)`` matrix ``m`` is skew-symmetric.

    Args:
      m: the concrete matrix, shape ``(n, n)``.
      name: its name, for the error message.
      what: what it is for, for the error message.

    Raises:
      ValueError: ``m`` is not finite or ``max|m + mᵀ|`` exceeds the tolerance.
    """
    m = np.asarray(m, dtype=np.float64)
    _finite(m, name)
    size = max(float(np.max(np.abs(m))) if m.size else 0.0, 1.0)
    sym = float(np.max(np.abs(m + m.T)))
    if sym > eig_tol(m.shape[0]) * size:
        raise ValueError(
            f"{name} must be skew-symmetric ({what}); max |{name} + {name}ᵀ| = "
            f"{sym:.4g}."
        )


def check_noise_cov(
    eps: float, D: np.ndarray, B: np.ndarray, name: str, what: str
) -> np.ndarray:
    """``ε(2D - εB̂)`` in float64, checked PSD relative to the size of its two terms.

    Args:
      eps: the step size ``ε``.
      D: the diffusion matrix, shape ``(n, n)``.
      B: the gradient-noise covariance ``B̂``, shape ``(n, n)``.
      name: the name of the result, for the error message.
      what: what it is for, for the error message.

    Returns:
      The covariance ``ε(2D - εB̂)``, a float64 ``(n, n)`` NumPy array.

    Raises:
      ValueError: the covariance is not symmetric PSD.
    """
    two_d = 2.0 * eps * np.asarray(D, np.float64)
    b = eps * eps * np.asarray(B, np.float64)
    cov = two_d - b
    scale = float(max(np.max(np.abs(two_d)), np.max(np.abs(b))))
    check_symmetric_psd(cov, name, what, scale=scale)
    return cov
