"""Timing emulation of a fused CEnLMC step on the SIR black box (issue 30, item 3).

Not the algorithm: a cost-equivalent program, to size the gain before building it. A
fused step would evaluate the values at the moved particles and the next step's
finite differences of the particles already known to need a gradient (R1 failed, an
empty eta-ball last step, fewer than N* R2-neighbours among the new w) in ONE model
call, with a count pass over the new w for the N* test; the gradients at this step's
particles come from the previous step's call (here: zeros of the same shape). Compared
with the library's CEnLMC step (two model calls) and LMC's (one), forward differences,
N = 2,000, h = 0.05, parameters of suggest_cenlmc_params, after 60 steps; process CPU
time of 25 interleaved calls, one XLA thread.

Run: ``taskset -c 0 python benchmarks/results/black_box/fused_emulation.py``
(result: fused_emulation.md).
"""

import os

os.environ["XLA_FLAGS"] = (
    "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
)

import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import cenlmc_jax as cj  # noqa: E402
from cenlmc_jax.gradients.finite_difference import finite_difference  # noqa: E402
from cenlmc_jax.pairwise import ensemble_force  # noqa: E402

p = cj.models.inverse_problems.sir_epidemic_black_box(num_rk4_steps=200)
N, D, H = 2000, 2, 0.05
s = cj.ensemble.tuning.suggest_cenlmc_params(D, H, num_particles=N)
fd = finite_difference(p.logdensity_fn, scheme="forward")
cen = cj.cenlmc(
    p.logdensity_fn, H, s.eta, s.r1, s.r2, s.n_star, s.m_f, f_star=p.f_star, grad_fn=fd
)
lmc = cj.lmc(p.logdensity_fn, H, grad_fn=fd)
x0 = 2.0 * jax.random.normal(jax.random.key(3), (N, D))
st = cj.sample(jax.random.key(1), cen, cen.init(x0), 60, check_convergence=False).state
SIZES = sorted({-(-N * k // 8) for k in range(1, 9)})


def fused_like(key, st, ahead):
    x, w = st.position, st.w
    f, dt = -st.logdensity, st.position.dtype
    pf = ensemble_force(
        x, f, st.log_p, jnp.asarray(s.eta, dt), w=w, r2=jnp.asarray(s.r2, dt)
    )
    need = (
        ~(jnp.linalg.norm(x - w, axis=-1) <= s.r1)
        | ~(f <= st.f_star + s.m_f)
        | (pf.n_r2 < s.n_star)
    )
    ens = pf.force_sum / jnp.maximum(pf.n_r2, 1).astype(dt)[:, None]
    force = jnp.where(need[:, None], -ahead, ens)
    noise = jax.random.normal(key, x.shape, dt)
    w_new = x - H * force
    x_new = w_new + jnp.sqrt(2 * H) * noise
    zeros = jnp.zeros(N, dt)
    count = ensemble_force(
        w_new, zeros, zeros, jnp.asarray(s.r2, dt), block_sparse=True
    ).n_ball
    pre = (
        (jnp.linalg.norm(x_new - w_new, axis=-1) > s.r1)
        | (count < s.n_star)
        | (pf.n_ball < 1)
    )
    idx = jnp.nonzero(pre, size=N, fill_value=N)[0]

    def branch(b):
        def run(_):
            at = jnp.minimum(idx[:b], N - 1)
            delta, pts = jax.vmap(fd._shifted)(x_new[at])
            vals = jax.vmap(p.logdensity_fn)(
                jnp.concatenate([x_new, pts.reshape(-1, D)])
            )
            g = (vals[N:].reshape(b, D) - vals[at][:, None]) / delta
            return vals[:N], jnp.zeros_like(x).at[idx[:b]].set(g, mode="drop")

        return run

    which = jnp.searchsorted(jnp.asarray(SIZES), jnp.sum(pre))
    return lax.switch(which, [branch(b) for b in SIZES], None)


fns = {
    "CEnLMC step": (jax.jit(cen.step), (jax.random.key(5), st)),
    "fused emulation": (
        jax.jit(fused_like),
        (jax.random.key(5), st, jnp.zeros_like(st.position)),
    ),
    "LMC step": (jax.jit(lmc.step), (jax.random.key(5), lmc.init(st.position))),
}
for fn, a in fns.values():
    jax.block_until_ready(fn(*a))
ts = {k: [] for k in fns}
for _ in range(25):
    for k, (fn, a) in fns.items():
        c0 = time.process_time()
        jax.block_until_ready(fn(*a))
        ts[k].append(time.process_time() - c0)
for k in fns:
    print(f"{k}: median {1e3 * np.median(ts[k]):.2f} ms")
for k in ("CEnLMC step", "fused emulation"):
    r = np.asarray(ts["LMC step"]) / np.asarray(ts[k])
    print(f"LMC / {k}: {np.median(r):.3f} [{r.min():.3f}, {r.max():.3f}]")
