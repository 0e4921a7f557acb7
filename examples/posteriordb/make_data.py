"""Write the data of the three example models to a folder.

The data are posteriordb's, shipped in cenlmc_jax.models.posteriordb.

python examples/posteriordb/make_data.py OUT_DIR
    ->  OUT_DIR/kidiq.csv, earnings.csv, garch11.npz
"""

import sys
from pathlib import Path

import numpy as np

from cenlmc_jax.models import posteriordb


def write(out: Path) -> dict:
    """The three data files in ``out``, by model name."""
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    for model, name, cols in (
        ("kidiq", "kidiq-kidscore_momiq", ("kid_score", "mom_iq")),
        ("earnings", "earnings-earn_height", ("earn", "height")),
    ):
        data = posteriordb.load_data(name)
        path = out / f"{model}.csv"
        np.savetxt(
            path,
            np.stack([data[c] for c in cols], axis=1),
            delimiter=",",
            header=",".join(cols),
            comments="",
            fmt="%.17g",
        )
        files[model] = path
    data = posteriordb.load_data("garch-garch11")
    files["garch11"] = out / "garch11.npz"
    np.savez(
        files["garch11"],
        y=np.asarray(data["y"], np.float64),
        sigma1=np.asarray(data["sigma1"], np.float64),
    )
    return files


if __name__ == "__main__":
    print(write(Path(sys.argv[1] if len(sys.argv) > 1 else ".")))
