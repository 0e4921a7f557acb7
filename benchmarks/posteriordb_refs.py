"""Copy the ten posteriordb posteriors into ``cenlmc_jax/models/posteriordb/data/`` (run
once; the tests never read ``../shared``).

For each posterior folder of ``SOURCE`` (default ``../shared/posteriordb``, relative to
the repository root):

* ``data.json.zip`` -> ``data/<name>.json`` (``<name>.json.gz`` for data above 100 kB:
  diamonds, 2.3 MB of JSON);
* ``model.stan`` -> ``data/<name>.stan`` (the model the JAX code transcribes, kept for
  the reader);
* the reference draws (10 chains x 1,000 NUTS draws on the constrained scale) -> one
  entry of ``data/refs.json``: per parameter, in the reference's order, the mean and the
  sd (``ddof=1``) over all 10,000 draws, computed with NumPy here, plus the reference's
  bulk ESS of that parameter (``reference_info.json``), from which a reader gets the
  reference's own MCSE (``sd / sqrt(ess)``, about 1 % of the sd).

Run: ``python benchmarks/posteriordb_refs.py [SOURCE]``. It overwrites the files; the
  licence is copied too.
"""

from __future__ import annotations

import gzip
import json
import shutil
import sys
import zipfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "cenlmc_jax" / "posteriordb" / "data"
SMALL_BYTES = 100_000


def _read_zip_json(path: Path):
    with zipfile.ZipFile(path) as z:
        (member,) = z.namelist()
        return json.loads(z.read(member))


def reference_moments(folder: Path) -> dict:
    """Means and sds (ddof = 1) of the reference draws, pooled over chains, in the
    reference's name order."""
    draws = _read_zip_json(folder / "reference_draws.json.zip")
    info = json.loads((folder / "reference_info.json").read_text())
    names = list(draws[0])
    ess = dict(
        zip(
            info["diagnostics"]["diagnostic_information"]["names"],
            info["diagnostics"]["effective_sample_size_bulk"],
            strict=True,
        )
    )
    out = {}
    for n in names:
        x = np.concatenate([np.asarray(chain[n], dtype=np.float64) for chain in draws])
        out[n] = {
            "mean": float(x.mean()),
            "sd": float(x.std(ddof=1)),
            "ess_bulk": float(ess[n]),
        }
    return {
        "names": names,
        "num_draws": int(sum(len(c[names[0]]) for c in draws)),
        "params": out,
    }


def main(source: Path) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    refs = {}
    for folder in sorted(p for p in source.iterdir() if p.is_dir()):
        name = folder.name
        data = _read_zip_json(folder / "data.json.zip")
        text = json.dumps(data, separators=(",", ":"))
        if len(text) > SMALL_BYTES:
            with gzip.open(
                OUT / f"{name}.json.gz", "wt", encoding="utf-8", compresslevel=9
            ) as f:
                f.write(text)
        else:
            (OUT / f"{name}.json").write_text(text + "\n")
        shutil.copyfile(folder / "model.stan", OUT / f"{name}.stan")
        refs[name] = reference_moments(folder)
        print(
            f"{name}: {len(refs[name]['names'])} reference quantities, data "
            f"{len(text):,} bytes"
        )
    (OUT / "refs.json").write_text(json.dumps(refs, indent=1) + "\n")
    shutil.copyfile(
        source / "LICENCE-posteriordb.md", OUT.parent / "LICENCE-posteriordb.md"
    )


if __name__ == "__main__":
    main(
        Path(sys.argv[1])
        if len(sys.argv) > 1
        else ROOT.parent / "shared" / "posteriordb"
    )
