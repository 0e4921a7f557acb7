"""The names and module paths of release 0.1, kept working for one release.

They warn with a ``FutureWarning``. 0.2 laid the package out as the algorithms
(``ensemble/``, ``adaptation/``, ``models/``, ...) and cut the top level to the
names in ``cenlmc_jax.__all__``. An old name (``cj.lmc_step``, ``cj.targets``)
resolves through the package's ``__getattr__``; an old module path
(``import cenlmc_jax.langevin``) through :class:`OldModuleFinder`, which hands out
the module that replaced it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import types
import warnings

__all__ = ["OLD_MODULES", "OLD_NAMES", "OldModuleFinder", "old_name", "Package"]

#: Old module path -> the module that holds its contents now.
OLD_MODULES = {
    "cenlmc_jax.langevin": "cenlmc_jax.ensemble.lmc",
    "cenlmc_jax.langevin_adaptation": "cenlmc_jax.adaptation.langevin_warmup",
    "cenlmc_jax.curvature": "cenlmc_jax.adaptation.step_size",
    "cenlmc_jax.warmup_parts": "cenlmc_jax.adaptation.mass_matrix",
    "cenlmc_jax.preconditioning": "cenlmc_jax.ensemble.whitened",
    "cenlmc_jax.tuning": "cenlmc_jax.ensemble.tuning",
    "cenlmc_jax.ensemble.samplers": "cenlmc_jax.ensemble.cenlmc",
    "cenlmc_jax.ensemble.states": "cenlmc_jax.ensemble",
    "cenlmc_jax.ensemble.least_squares_moments": (
        "cenlmc_jax.ensemble.least_squares.moments"
    ),
    "cenlmc_jax.ensemble.least_squares_pallas": (
        "cenlmc_jax.ensemble.least_squares.pallas"
    ),
    "cenlmc_jax.sgmcmc.lda": "cenlmc_jax.models.lda",
    "cenlmc_jax.targets": "cenlmc_jax.models.targets",
    "cenlmc_jax.problems": "cenlmc_jax.models.inverse_problems",
    "cenlmc_jax.posteriordb": "cenlmc_jax.models.posteriordb",
    "cenlmc_jax.numpyro_model": "cenlmc_jax.models.numpyro",
    "cenlmc_jax.summary": "cenlmc_jax.diagnostics.summary",
    "cenlmc_jax.plots": "cenlmc_jax.diagnostics.plots",
    "cenlmc_jax.named_draws": "cenlmc_jax.diagnostics.named_draws",
    "cenlmc_jax.finite_difference": "cenlmc_jax.gradients.finite_difference",
    "cenlmc_jax.grad_modes": "cenlmc_jax.gradients.modes",
}

_PACKAGES = {
    "cenlmc_jax.ensemble": (
        "LMCState LMCInfo lmc_init lmc_step EnLMCState EnLMCInfo enlmc_init enlmc_step "
        "CEnLMCState CEnLMCInfo cenlmc_init cenlmc_step coupling_distance TunedCEnLMC "
        "Whitening WhitenedState"
    ),
    "cenlmc_jax.adaptation": "LangevinWarmup LangevinWarmupInfo",
    "cenlmc_jax.models": "NumPyroModel",
    "cenlmc_jax.diagnostics.summary": "SummaryTable",
    "cenlmc_jax.run": "Moments",
    "cenlmc_jax.base": "StepSize",
    "cenlmc_jax.sgmcmc": (
        "RecipeState RecipeInfo recipe_init recipe_step SGHMCState sghmc_init "
        "sghmc_step SGRHMCState SGRHMCInfo sgrhmc_init sgrhmc_step gsgrhmc_inv_metric"
    ),
    "cenlmc_jax.gradients": (
        "grad_estimator_from_grad grad_estimator_from_logdensity "
        "minibatch_grad_estimator noisy_grad_estimator"
    ),
    "cenlmc_jax.irreversible": (
        "Proposal IrreversibleMHState IrreversibleMHInfo irreversible_mh_init "
        "irreversible_mh_step coordinatewise_proposal gamma_proposal sde_proposal "
        "RWMHState RWMHInfo rwmh_init rwmh_step SDEPoint"
    ),
}

#: Old top-level name -> ``(module, attribute)`` it is now; attribute None: the module
#: itself.
OLD_NAMES: dict[str, tuple[str, str | None]] = {
    name: (module, name)
    for module, names in _PACKAGES.items()
    for name in names.split()
}
# (not summary and finite_difference: 0.1's modules of those names were shadowed by the
# functions, which the top level still exports)
OLD_NAMES.update(
    {
        old.rsplit(".", 1)[1]: (new, None)
        for old, new in OLD_MODULES.items()
        if old.count(".") == 1
        and old.rsplit(".", 1)[1] not in ("summary", "finite_difference")
    }
)


def _warn(old: str, new: str) -> None:
    warnings.warn(
        f"{old} is deprecated since cenlmc_jax 0.2 and goes in 0.3: use {new}",
        FutureWarning,
        stacklevel=3,
    )


def old_name(name: str):
    """The object an old top-level name stands for, with a ``FutureWarning``.

    Args:
      name: an attribute looked up on ``cenlmc_jax`` and not found there.

    Returns:
      The module or object of :data:`OLD_NAMES` that replaced it.

    Raises:
      AttributeError: ``name`` is not an old name either.
    """
    if name not in OLD_NAMES:
        raise AttributeError(f"module 'cenlmc_jax' has no attribute {name!r}")
    module, attr = OLD_NAMES[name]
    _warn(f"cenlmc_jax.{name}", module if attr is None else f"{module}.{attr}")
    mod = importlib.import_module(module)
    return mod if attr is None else getattr(mod, attr)


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        return importlib.import_module(self.target)

    def exec_module(self, module):
        pass


class OldModuleFinder(importlib.abc.MetaPathFinder):
    """Finds an old module path of :data:`OLD_MODULES`.

    It runs after every other finder failed.
    """

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in OLD_MODULES:
            return None
        _warn(fullname, OLD_MODULES[fullname])
        return importlib.machinery.ModuleSpec(fullname, _Alias(OLD_MODULES[fullname]))


class Package(types.ModuleType):
    """The top-level package's class.

    Importing an old module path that shares its name with a function of the API
    (``cenlmc_jax.summary``, ``cenlmc_jax.finite_difference``) must not replace that
    function by the module (the import system sets the submodule as an attribute),
    whether the function was already looked up or not (the package imports its names
    lazily): a public name takes only the submodule of that very name.
    """

    def __setattr__(self, name, value):
        if (
            isinstance(value, types.ModuleType)
            and name in self.__dict__.get("__all__", ())
            and value.__name__ != f"{self.__name__}.{name}"
        ):
            return
        super().__setattr__(name, value)
