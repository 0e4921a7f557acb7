"""Writes docs/guide/migration.md from cenlmc_jax._compat (OLD_MODULES, OLD_NAMES).

Run from the repository root: ``python docs/guide/make_migration.py``. The tables
are generated; edit the text here, not in migration.md.
"""

from pathlib import Path

from cenlmc_jax._compat import OLD_MODULES, OLD_NAMES

HEAD = """# Migrating from 0.1 to 0.2

0.2 laid the package out as the algorithms (`ensemble/`, `adaptation/`,
`models/`, `diagnostics/`, ...) and cut the top level to the names in
`cenlmc_jax.__all__`. Every name and module path of 0.1 still works in 0.2,
with a `FutureWarning` that names its replacement; they go in 0.3. To find the
old names in your code, turn the warning into an error:

```python
import warnings
warnings.simplefilter("error", FutureWarning)
```

New in 0.2: `cj.mala(logdensity_fn, step_size, *, inverse_mass_matrix=None)`
(before: `cj.irreversible_mh(logp, cj.sde_proposal(D, 0.0, logp, step))`).

The tables below are **generated** from `cenlmc_jax/_compat.py` (`OLD_NAMES`,
`OLD_MODULES`) by `python docs/guide/make_migration.py`; do not edit them by
hand.
"""


def main() -> str:
    lines = [HEAD, "## Top-level names", "", "| 0.1 | 0.2 |", "|---|---|"]
    for old, (module, attr) in sorted(OLD_NAMES.items(), key=lambda kv: kv[0].lower()):
        new = module if attr is None else f"{module}.{attr}"
        lines.append(f"| `cj.{old}` | `{new.replace('cenlmc_jax', 'cj', 1)}` |")
    lines += ["", "## Module paths", "", "| 0.1 | 0.2 |", "|---|---|"]
    for old, new in sorted(OLD_MODULES.items()):
        lines.append(f"| `import {old}` | `import {new}` |")
    lines += [
        "",
        "(`cj` is `import cenlmc_jax as cj`.) An old module path hands out the new",
        "module itself: `import cenlmc_jax.problems` gives "
        "`cenlmc_jax.models.inverse_problems`.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    out = Path(__file__).with_name("migration.md")
    out.write_text(main())
    print(f"wrote {out}")
