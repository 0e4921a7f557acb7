"""The performance page, generated from ``benchmarks/results/`` at every docs build.

``docs/conf.py`` hands Sphinx :func:`render`'s Markdown in place of
``docs/performance.md``'s text. Each benchmark writes its tables as Markdown
(``benchmarks/results/NAME.md``) beside its raw numbers (``NAME.json``, with the
machine and the command line); this module picks the results a user cares about,
groups them, and includes each file's text under a heading with the command that made
it and the file it came from. Nothing here is a number typed by hand.

Run ``python docs/performance.py`` to print the page.
"""

import json
import re
import sys
from pathlib import Path

# (section title, what it answers, result files relative to benchmarks/results/; a
# file given as (file, words) gets the words after its title, where titles repeat)
SECTIONS = [
    (
        "Against other libraries",
        "Time per step against BlackJAX on the same model and keys, and whether the "
        "draws agree.",
        ["peers.md", "sgrhmc.md"],
    ),
    (
        "Correctness on real posteriors (posteriordb)",
        "Each sampler's default workflow on posteriordb posteriors against the "
        "reference draws: passed, flagged, or silently wrong, and its cost relative "
        "to NUTS.",
        [
            "posteriordb.md",
            ("posteriordb_cenlmc/posteriordb.md", "CEnLMC's cells"),
            "langevin_warmup.md",
        ],
    ),
    (
        "Expensive gradients, inverse problems and black-box models",
        "Where CEnLMC's saved gradients turn into saved time: inverse problems whose "
        "gradient costs many model solves, and NumPy models with finite-difference "
        "gradients.",
        [
            "cenlmc.md",
            "inverse.md",
            ("black_box/inverse.md", "the SIR model as a NumPy black box"),
            ("black_box_heavy/inverse.md", "the black box with a costlier simulator"),
            "grad_mode.md",
        ],
    ),
    (
        "Scaling",
        "The ensemble force and the CEnLMC step as the ensemble grows: dense and "
        "tiled, block-sparse, several ensembles at once, sharded over devices.",
        [
            "scale.md",
            "pairwise.md",
            "sparse.md",
            "vmap_ensembles.md",
            "sharding.md",
        ],
    ),
    (
        "Compile time and the command line's job",
        "How long the first call takes, when a program is compiled again, and what "
        "the command line's main job costs on a warm compilation cache.",
        ["one_compile.md", "recompile.md", "summary.md", "cli_cpu.md"],
    ),
]

INTRO = """\
# Performance

Measurements from `benchmarks/`, generated at every docs build by
`docs/performance.py` from the Markdown and JSON files the benchmarks write into
`benchmarks/results/`; rerun a benchmark with the command given for it and rebuild the
docs to update this page. Most were run on a shared 2-core CPU: absolute times are
noisy, read the ratios. `benchmarks/results/` holds more (the tuner's frontier, the
least-squares gradient, the audit's thresholds, the online LDA, ...).
"""


def _json_for(md: Path) -> dict:
    path = md.with_suffix(".json")
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _command(text: str, meta: dict) -> str | None:
    command = meta.get("command")
    if not command:
        found = re.search(r"^Reproduce: `([^`]+)`", text, re.M)
        command = found.group(1) if found else None
    if command:
        # the benchmarks are run from the repository root or from benchmarks/
        command = re.sub(
            r"^python (bench_|code_size)", r"python benchmarks/\1", command
        )
    return command


def _body(text: str) -> tuple[str, str]:
    """The file's title and its text below it, headings demoted under ours (H3+)."""
    lines = text.strip().splitlines()
    title = lines[0].lstrip("#").strip() if lines and lines[0].startswith("#") else ""
    out = []
    for line in lines[1 if title else 0 :]:
        if line.startswith("Reproduce:"):
            continue  # shown above the text, with the file
        heading = re.match(r"^(#+)\s", line)
        if heading:
            line = "##" + line  # the file's H2 becomes H4 under our H3
        out.append(line)
    body = "\n".join(out).strip()
    # links to other result files are not pages of the docs: keep their text
    body = re.sub(r"(?<!!)\[([^\]]+)\]\((?!https?:)[^)]+\)", r"\1", body)
    return title, body


def _backends(results: Path) -> set[str]:
    found = set()
    for path in results.rglob("*.json"):
        meta = _json_for(path.with_suffix(".md"))
        machine = meta.get("machine")
        if isinstance(machine, dict) and machine.get("backend"):
            found.add(str(machine["backend"]))
    return found


def render(root: Path) -> str:
    results = Path(root) / "benchmarks" / "results"
    parts = [INTRO]
    for title, blurb, files in SECTIONS:
        parts.append(f"## {title}\n\n{blurb}\n")
        for entry in files:
            name, words = entry if isinstance(entry, tuple) else (entry, "")
            md = results / name
            if not md.exists():
                parts.append(
                    f"*`benchmarks/results/{name}`: not there (not run yet).*\n"
                )
                continue
            text = md.read_text()
            meta = _json_for(md)
            heading, body = _body(text)
            command = _command(text, meta)
            heading = heading or name
            parts.append(f"### {heading}{': ' + words if words else ''}\n")
            source = f"From `benchmarks/results/{name}`"
            if md.with_suffix(".json").exists():
                raw = Path(name).with_suffix(".json")
                source += f" (raw numbers: `benchmarks/results/{raw}`)"
            parts.append(source + ".\n")
            if command:
                parts.append(f"```bash\n{command}\n```\n")
            parts.append(body + "\n")
    backends = _backends(results)
    gpu = sorted(b for b in backends if b not in ("cpu",))
    parts.append("## GPU\n")
    if gpu:
        parts.append(
            "Results in `benchmarks/results/` were measured on: "
            + ", ".join(f"`{b}`" for b in gpu)
            + " (see the machine line of each table above).\n"
        )
    else:
        parts.append(
            "No GPU measurements yet: every JSON file in `benchmarks/results/` was "
            f"measured on the {', '.join(sorted(backends)) or 'CPU'} backend. "
            "`benchmarks/gpu_check.sh` runs the GPU checks on a machine with one.\n"
        )
    return "\n".join(parts)


if __name__ == "__main__":
    root = (
        Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]
    )
    sys.stdout.write(render(root))
