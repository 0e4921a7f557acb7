"""The command line's verdict reads the flags the infos declare (``run_flags``,
``cj.base.RunFlag``), the hook ``cj.sample`` warns through (issue 19: the CLI kept its
own list, so a flag the driver warned about, such as a collapsed acceptance rate, left
the verdict "reliability checks passed" and the exit status 0).

* A toy sampler declaring flags under names no part of the CLI knows: every flag the
  driver warns about is a problem of the verdict, at the same first step, for each kind
  (any step, ``kept_only``, ``every_step``, a ``kept_only`` mean below a floor) and
  chunking; nothing set, nothing reported.
* The CLI end to end: a flag added to RW-MH's info class at run time (a field the
  verdict cannot know) makes the job print UNRELIABLE and exit 1, and 0 with
  ``--allow-unreliable``; the real ``zero_acceptance`` flag too.
"""

import warnings
from argparse import Namespace
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from cli_helpers import run_cli

import cenlmc_jax as cj
from cenlmc_jax.base import RunFlag
from cenlmc_jax.cli import verdict
from cenlmc_jax.run import WATCH_MIN_STEPS

CHAINS, STEPS, BURN_IN, CHUNK = 3, 60, 20, 20


def _message(field):
    return lambda infos, step: f"toy flag {field} from step {step}"


class ToyState(NamedTuple):
    position: jax.Array  # (CHAINS, 1)
    t: jax.Array
    masks: (
        jax.Array
    )  # (4, STEPS + BURN_IN, CHAINS): when each of the four fields is set


class ToyInfo(NamedTuple):
    odd_name_a: jax.Array  # (CHAINS,) each
    odd_name_b: jax.Array
    odd_name_c: jax.Array
    # a number: 0.0 where "set", 1.0 elsewhere (CEnLMC's ensemble fraction's kind of
    # flag)
    odd_name_d: jax.Array
    diverged: jax.Array

    run_flags = (
        RunFlag("odd_name_a", _message("odd_name_a")),
        RunFlag("odd_name_b", _message("odd_name_b"), kept_only=True),
        RunFlag("odd_name_c", _message("odd_name_c"), every_step=True),
        RunFlag("odd_name_d", _message("odd_name_d"), kept_only=True, mean_below=0.5),
    )


def _toy_step(key, state):
    """A random walk (the chains move: never frozen) whose info sets each field at the
    steps of its mask (in the state: one step function, so one compilation per
    ``info_reduce`` for all the cases)."""
    a, b, c, d = state.masks[:, state.t]
    info = ToyInfo(a, b, c, 1.0 - d.astype(jnp.float32), diverged=jnp.zeros((), bool))
    moved = state.position + jax.random.normal(key, state.position.shape)
    return ToyState(moved, state.t + 1, state.masks), info


def _masks(**set_at):
    """Each field's mask: ``set_at[field] = (first step, last step, chains)``; the
    others never set."""
    out = {f: np.zeros((STEPS + BURN_IN, CHAINS), bool) for f in ToyInfo._fields[:4]}
    for field, (lo, hi, chains) in set_at.items():
        out[field][lo : hi + 1, chains] = True
    return out


def _driver_and_verdict(masks, info_reduce):
    """(the driver's RuntimeWarnings, the verdict's problems) of one toy run."""
    state = ToyState(
        jnp.zeros((CHAINS, 1)),
        jnp.zeros((), jnp.int32),
        jnp.asarray(np.stack([masks[f] for f in ToyInfo._fields[:4]])),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = cj.sample(
            jax.random.key(0),
            _toy_step,
            state,
            STEPS,
            burn_in=BURN_IN,
            chunk_size=CHUNK,
            info_reduce=info_reduce,
            check_convergence=False,
        )
    warned = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    return warned, verdict.flag_problems(Namespace(sampler="lmc"), res)


CASES = {
    # field: (first, last, chains) -> the first step both must name
    "nothing_set": ({}, {}),
    "plain_in_burn_in_counts": ({"odd_name_a": (3, 3, 1)}, {"odd_name_a": 3}),
    "plain_on_kept_steps": ({"odd_name_a": (45, 50, slice(None))}, {"odd_name_a": 45}),
    "kept_only_burn_in_does_not_count": ({"odd_name_b": (1, 5, 0)}, {}),
    "kept_only_first_kept_step": (
        {"odd_name_b": (BURN_IN + 7, BURN_IN + 9, 2)},
        {"odd_name_b": BURN_IN + 7},
    ),
    "every_step_whole_chunk": ({"odd_name_c": (40, 59, 0)}, {"odd_name_c": 40}),
    "every_step_one_step_short": (
        {"odd_name_c": (41, 41 + WATCH_MIN_STEPS - 2, 0)},
        {},
    ),
    "all_three": (
        {"odd_name_a": (0, 0, 0), "odd_name_b": (70, 79, 1), "odd_name_c": (20, 39, 2)},
        {"odd_name_a": 0, "odd_name_b": 70, "odd_name_c": 20},
    ),
    # the mean over the kept steps (and chains) below 0.5: named at the first kept step;
    # the burn-in not counted
    "mean_below_most_kept_steps": (
        {"odd_name_d": (BURN_IN + 10, STEPS + BURN_IN - 1, slice(None))},
        {"odd_name_d": BURN_IN},
    ),
    "mean_below_fewer_than_half_of_the_kept_steps": (
        {"odd_name_d": (BURN_IN, BURN_IN + 25, slice(None))},
        {},
    ),
    "mean_below_burn_in_does_not_count": (
        {"odd_name_d": (0, BURN_IN - 1, slice(None))},
        {},
    ),
}


@pytest.mark.parametrize("info_reduce", [None, "mean"])
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_every_flag_the_driver_warns_about_is_a_problem_of_the_verdict(
    case, info_reduce
):
    set_at, expected = CASES[case]
    warned, found = _driver_and_verdict(_masks(**set_at), info_reduce)
    toy_warned = [w for w in warned if "toy flag" in w]
    assert len(toy_warned) == len(expected) == len(found), (toy_warned, found)
    for field, first in expected.items():
        text = f"toy flag {field} from step {first}"
        assert any(text in w for w in toy_warned), (
            text,
            toy_warned,
        )  # the driver's own report ...
        assert any(text in p and f"[info.{field};" in p for p in found), (
            text,
            found,
        )  # ... is the verdict's
    if (
        "odd_name_c" in expected and info_reduce is None
    ):  # per chain: which chains, as the driver says
        assert any(p.startswith("1 of 3 chains: toy flag odd_name_c") for p in found), (
            found
        )


@pytest.mark.parametrize("info_reduce", [None, "mean"])
def test_every_step_flags_are_judged_on_any_stretch_not_on_the_driver_chunks(
    info_reduce,
):
    """A stretch of WATCH_MIN_STEPS steps across two of the driver's chunks: the driver,
    which judges each chunk whole, does not warn; the verdict does (it cannot see the
    chunking, which ``--checkpoint-every`` changes, so it takes the stricter rule that
    contains the driver's for every chunking)."""
    warned, found = _driver_and_verdict(
        _masks(odd_name_c=(35, 35 + WATCH_MIN_STEPS - 1, 1)), info_reduce
    )
    assert not [w for w in warned if "toy flag" in w]
    assert len(found) == 1 and "toy flag odd_name_c from step 35" in found[0], found


def test_averaged_infos_cannot_tell_chains_taking_turns_from_one_stuck_chain():
    """Chain 0 set at steps 40-44, chain 1 at 45-49: no chain at every step. Per-chain
    infos: neither the driver nor the verdict reports it; averaged over the chains, the
    verdict (which then sees only "set on some chain" at each step) does: the stricter
    side, stated in its message."""
    masks = _masks(odd_name_c=(40, 44, 0))
    masks["odd_name_c"][45:50, 1] = True
    for info_reduce, reported in ((None, False), ("mean", True)):
        warned, found = _driver_and_verdict(masks, info_reduce)
        assert not [w for w in warned if "toy flag" in w]
        assert bool(found) is reported, (info_reduce, found)
    assert "on some chain or particle" in found[0]


# --------------------------------------------------------------------------
# End to end: a flag the verdict has never heard of, added to RW-MH's info class.
# --------------------------------------------------------------------------

RWMH = [
    "sample",
    "--sampler",
    "rwmh",
    "--no-adapt",
    "--particles",
    "100",
    "--steps",
    "100",
    "--burn-in",
    "50",
]


@pytest.fixture
def rwmh_flag(monkeypatch):
    def add(flag, prop=None):
        if prop is not None:
            monkeypatch.setattr(
                cj.irreversible.RWMHInfo, flag.field, property(prop), raising=False
            )
        monkeypatch.setattr(
            cj.irreversible.RWMHInfo,
            "run_flags",
            cj.irreversible.RWMHInfo.run_flags + (flag,),
        )

    return add


@pytest.mark.parametrize("kind", ["any_step", "kept_only", "every_step"])
def test_a_flag_the_driver_warns_about_makes_the_job_unreliable(
    kind, rwmh_flag, capsys
):
    if (
        kind == "every_step"
    ):  # a property of the info class, set at every step of every chain
        rwmh_flag(
            RunFlag("always_set", _message("always_set"), every_step=True),
            prop=lambda self: jnp.ones_like(self.acceptance_rate, bool),
        )
        field, first = "always_set", "0"
    # a proposal accepted: at the first step (any step), at the first kept one
    # (kept_only)
    else:
        rwmh_flag(
            RunFlag(
                "is_accepted", _message("is_accepted"), kept_only=kind == "kept_only"
            )
        )
        field, first = "is_accepted", "50" if kind == "kept_only" else "0"
    code, out, _ = run_cli(RWMH, capsys)
    assert code == verdict.EXIT_UNRELIABLE, out
    assert (
        f"warning: {'100 of 100 chains: ' if kind == 'every_step' else ''}toy flag "
        f"{field} from step {first}" in out
    )
    # (the CLI's infos are averaged over the chains: the verdict names the stretch, not
    # the chains)
    lines = [
        line
        for line in out.splitlines()
        if "UNRELIABLE: " in line and f"toy flag {field}" in line
    ]
    assert (
        len(lines) == 1
        and f"from step {first}" in lines[0]
        and f"[info.{field};" in lines[0]
    ), out
    assert "--step-size" in lines[0] and verdict.RELIABLE not in out
    code, out, _ = run_cli(RWMH + ["--allow-unreliable"], capsys)
    assert (
        code == 0
        and "--allow-unreliable: exit status 0" in out
        and f"toy flag {field}" in out
    )


def test_the_same_job_without_the_flag_is_reliable(capsys):
    code, out, _ = run_cli(RWMH, capsys)
    assert code == 0 and verdict.RELIABLE in out and "UNRELIABLE" not in out, out


def test_a_collapsed_acceptance_rate_is_unreliable_by_its_own_flag(capsys):
    """RW-MH with a proposal sd of 1e4 on N(0, I_2): every log ratio is about -|z*|²/2 ~
    -5e7, below exp's underflow, so every chain's acceptance probability is exactly 0 at
    every step: the driver's ``zero_acceptance`` flag (declared by RWMHInfo), now one of
    the verdict's problems."""
    code, out, _ = run_cli(RWMH + ["--step-size", "1e4"], capsys)
    assert code == verdict.EXIT_UNRELIABLE, out
    assert (
        "warning: 100 of 100 chains: the acceptance probability collapsed to 0" in out
    )
    assert "UNRELIABLE: the acceptance probability collapsed to 0" in out
    assert "[info.zero_acceptance;" in out


class RateInfo(NamedTuple):
    # a rate per step averaged over chains (HMC's divergent trajectories' kind)
    rate: np.ndarray

    run_flags = (
        RunFlag(
            "rate",
            _message("rate"),
            kept_only=True,
            rising=True,
            steady=lambda infos, r: f"steady rate {r:.3f}",
        ),
    )


@pytest.mark.parametrize(
    "case, problem, note",
    [
        # 4 % of moves at every kept step (a banana's arms): a warning, exit 0
        ("steady", False, "steady rate 0.040"),
        # 1 % in the first half of the kept steps, 3 % in the second: the rise is a
        # problem (z far above 5), not a note
        ("rising", True, None),
        ("never", False, None),
        # only in the burn-in: nothing on the kept steps
        ("burn_in_only", False, None),
    ],
)
def test_a_steady_rate_is_a_warning_and_a_rising_one_a_problem(case, problem, note):
    rng = np.random.default_rng(0)
    steps, burn_in = 320, 160
    p = {
        "steady": np.full(steps, 0.04),
        "rising": np.r_[np.full(240, 0.01), np.full(80, 0.03)],
        "never": np.zeros(steps),
        "burn_in_only": np.r_[np.full(burn_in, 0.05), np.zeros(steps - burn_in)],
    }[case]
    # the per-step mean of 2,000 chains' Bernoulli draws
    rate = rng.binomial(2000, p) / 2000.0
    if case == "steady":
        rate[burn_in:] += 0.04 - rate[burn_in:].mean()  # the note prints the mean
    res = Namespace(info=RateInfo(rate), burn_in=burn_in)
    notes = []
    problems = verdict.flag_problems(Namespace(sampler="hmc"), res, notes)
    assert bool(problems) == problem, problems
    assert [n.split(" [")[0] for n in notes] == ([note] if note else []), notes


def test_stretches_of_one_warning_print_as_one_line():
    # cj.sample_until warns once per segment in which some chains were stuck (the
    # funnel: seven such lines); the verdict prints one, with the most chains at once,
    # the count of stretches and the steps they span; other warnings keep their place
    text = "the acceptance probability collapsed to 0"
    merged = verdict.merge_stretches(
        [
            f"7 of 2000 chains: {text} (at every step of 0..24)",
            "16 of 2000 chains never moved",
            f"12 of 2000 chains: {text} (at every step of 25..49)",
            f"3 of 2000 chains: {text} (at every step of 7000..7199)",
            f"1 of 3 chains: {text} (at every step of 41..49)",
        ]
    )
    assert merged == [
        f"up to 12 of 2000 chains at once: {text} (at every step of 3 stretches "
        "within steps 0..7199)",
        "16 of 2000 chains never moved",
        f"1 of 3 chains: {text} (at every step of 41..49)",
    ]


class DepthState(NamedTuple):
    position: jax.Array  # (CHAINS, 1)
    t: jax.Array
    depth: jax.Array  # (STEPS + BURN_IN,): the info's value at each step


class DepthInfo(NamedTuple):
    # a number per chain whose mean over the kept steps is judged (HMC's neck_depth's
    # kind of flag: a statistic of the kept infos above a threshold)
    depth: jax.Array
    diverged: jax.Array

    run_flags = (
        RunFlag(
            "depth",
            _message("depth"),
            kept_only=True,
            statistic=lambda infos: float(np.mean(np.asarray(infos.depth))),
            above=0.5,
        ),
    )


def _depth_step(key, state):
    info = DepthInfo(
        jnp.full((CHAINS,), state.depth[state.t]), diverged=jnp.zeros((), bool)
    )
    moved = state.position + jax.random.normal(key, state.position.shape)
    return DepthState(moved, state.t + 1, state.depth), info


@pytest.mark.parametrize("info_reduce", [None, "mean"])
@pytest.mark.parametrize(
    "case, flagged",
    # the kept steps' mean 0.8 > 0.5: flagged; 0.8 in the burn-in only, 0.2 after: not
    [("kept", True), ("burn_in_only", False)],
)
def test_a_statistic_flag_is_judged_on_the_kept_steps_by_driver_and_verdict(
    case, flagged, info_reduce
):
    depth = np.full(STEPS + BURN_IN, 0.8 if case == "kept" else 0.2, np.float32)
    depth[:BURN_IN] = 0.8
    state = DepthState(jnp.zeros((CHAINS, 1)), jnp.zeros((), jnp.int32), depth)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = cj.sample(
            jax.random.key(0),
            _depth_step,
            state,
            STEPS,
            burn_in=BURN_IN,
            info_reduce=info_reduce,
            check_convergence=False,
        )
    warned = [str(w.message) for w in caught if "toy flag depth" in str(w.message)]
    found = verdict.flag_problems(Namespace(sampler="lmc"), res)
    text = f"toy flag depth from step {BURN_IN}"
    assert bool(warned) == flagged and bool(found) == flagged, (warned, found)
    if flagged:
        assert text in warned[0] and text in found[0] and "[info.depth;" in found[0]
