"""Sphinx configuration of the cenlmc_jax documentation (built by ``docs/build.sh``).

Sources: the Markdown pages here (MyST), the API reference generated from the
docstrings (``docs/api/``: autodoc + napoleon, Google style), the notebooks of
``notebooks/`` (copied into ``docs/notebooks/`` at every build; myst-nb renders them
with their stored outputs, executing nothing) and the performance page, generated
at build time from ``benchmarks/results/`` by ``docs/performance.py``.
"""

import os
import re
import sys
import types
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
# document this checkout's package, wherever (and whether) it is installed
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import warnings  # noqa: E402

import performance  # noqa: E402  (docs/performance.py)
from sphinx.util import logging  # noqa: E402
from sphinx.util.nodes import make_refnode  # noqa: E402

import cenlmc_jax  # noqa: E402

logger = logging.getLogger(__name__)

project = "cenlmc_jax"
author = "the cenlmc_jax authors"
copyright = "the cenlmc_jax authors, Apache-2.0"
release = cenlmc_jax.__version__
version = release

extensions = [
    "myst_nb",  # Markdown pages (MyST) and notebooks
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",  # Google-style Args:/Returns:
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
]

exclude_patterns = [
    "_build",
    "build.sh",
    "**.ipynb_checkpoints",
    # included into notebooks/index.md, not a page of its own
    "notebooks/README.md",
]


# --- the notebooks: docs/notebooks/NAME.ipynb is a copy of notebooks/NAME.ipynb ------
# Made here, at every build (a file copied again only when it changed), so that a new
# notebook needs no edit of the docs; the copies are git-ignored
# (docs/notebooks/.gitignore). notebooks/README.md is copied too:
# docs/notebooks/index.md includes it, and its links to NAME.ipynb then resolve to the
# pages beside it. (Not symlinks: Sphinx resolves a link's real path, outside the source
# folder, and the README's links would not find the pages.)
def _copy_notebooks():
    here, there = DOCS / "notebooks", ROOT / "notebooks"
    wanted = {p.name: p for p in [*there.glob("*.ipynb"), there / "README.md"]}
    for copy in [*here.glob("*.ipynb"), here / "README.md"]:
        if (copy.is_symlink() or copy.exists()) and not (
            copy.name in wanted and wanted[copy.name].exists()
        ):
            copy.unlink()
    for name, source in sorted(wanted.items()):
        copy = here / name
        if copy.is_symlink():
            copy.unlink()
        if source.exists() and (
            not copy.exists() or copy.read_bytes() != source.read_bytes()
        ):
            # atomically: another build of this checkout may be reading it
            part = copy.with_name(f".{name}.{os.getpid()}.part")
            part.write_bytes(source.read_bytes())
            os.replace(part, copy)


_copy_notebooks()

# nbformat warns (a Python warning, not Sphinx's) that cells saved without an "id"
# field will be an error in a future nbformat; the notebooks render the same. Silenced
# for that one category only; `python -c "import nbformat ..."` normalize() on the
# notebooks would add the ids.
try:
    from nbformat.validator import MissingIDFieldWarning

    warnings.filterwarnings("ignore", category=MissingIDFieldWarning)
except ImportError:
    pass

# --- MyST and myst-nb --------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
# the notebooks are shown with the outputs they were saved with (CI executes none;
# the test suite runs them: tests/test_notebooks.py)
nb_execution_mode = "off"
nb_merge_streams = True

# --- autodoc / napoleon ------------------------------------------------------------
autodoc_default_options = {
    # automodule ... :members: documents exactly the module's __all__, in its order
    "members": True,
    "undoc-members": True,
    "member-order": "bysource",
}
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented"
python_use_unqualified_type_names = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# "Attributes:" sections of the NamedTuple states and infos become :ivar: fields (as
# .. attribute:: entries they would clash with autodoc's entries for the fields, which
# _skip_namedtuple_fields drops: they say only "Alias for field number k")
napoleon_use_ivar = True
# the fields' types are the class's annotations, written out as JAX's internal class
# (jaxlib._jax.Array); the descriptions give the shapes and dtypes
napoleon_attr_annotations = False
napoleon_use_rtype = False

# --- HTML ----------------------------------------------------------------------------
html_theme = "sphinx_book_theme"
html_title = f"cenlmc_jax {release}"
html_theme_options = {
    "show_toc_level": 2,
    "home_page_in_toc": True,
    "use_download_button": True,
}
html_static_path = ["_static"]
html_css_files = ["custom.css"]

# --- pages that may not exist yet -----------------------------------------------------
# The user guide (docs/guide/index.md) and the dependencies page (docs/dependencies.md)
# are written by others; until they exist, their lines are dropped from index.md's
# toctree (a toctree entry to a missing page would be a warning, and -W an error).
OPTIONAL_PAGES = {"guide/index": "guide/index.md", "dependencies": "dependencies.md"}


def _drop_missing_toctree_entries(app, docname, source):
    if docname != "index":
        return
    for entry, path in OPTIONAL_PAGES.items():
        if not (DOCS / path).exists():
            source[0] = re.sub(rf"(?m)^{re.escape(entry)}\s*$\n?", "", source[0])


# --- the performance page: generated from benchmarks/results at every build -------
def _generate_performance(app, docname, source):
    if docname == "performance":
        source[0] = performance.render(ROOT)


def _always_reread_performance(app, env, added, changed, removed):
    return ["performance"] if "performance" in env.found_docs else []


# --- the API reference covers every name of every __all__ ----------------------------
AUTO_TARGET = re.compile(r"^\.\. auto(\w+):: (\S+)", re.M)


def _check_api_coverage(app, env):
    documented = {}
    for page in sorted((DOCS / "api").glob("*.md")):
        for kind, target in AUTO_TARGET.findall(page.read_text()):
            documented[target] = kind
    missing = []
    for name in cenlmc_jax.__all__:
        obj = getattr(cenlmc_jax, name)
        if isinstance(obj, types.ModuleType):
            # a namespace: its page documents its __all__ (automodule :members:), and
            # the modules its __all__ names get their own automodule
            target = f"cenlmc_jax.{name}"
            if documented.get(target) != "module":
                missing.append(target)
            for sub in getattr(obj, "__all__", ()):
                if isinstance(getattr(obj, sub), types.ModuleType):
                    if documented.get(f"{target}.{sub}") != "module":
                        missing.append(f"{target}.{sub}")
        elif f"cenlmc_jax.{name}" not in documented:
            missing.append(f"cenlmc_jax.{name}")
    if missing:
        logger.warning(
            "docs/api/ does not document these public names (add them to a page "
            "there): %s",
            ", ".join(missing),
        )


# --- cross-references by the name a docstring uses
# -------------------------------------- A docstring names an object as its own module
# sees it (``:func:`lmc_init```, ``:class:`~cenlmc_jax.ensemble.lmc.LMCState```), while
# the API pages document it where users reach it (``cenlmc_jax.ensemble.lmc_init``). A
# Python reference that Sphinx could not resolve is resolved here to the one documented
# object whose dotted name ends with the reference's last component(s): the shortest
# such name (the top level before a namespace before a module), when only one has that
# length.
def _resolve_by_suffix(app, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "").lstrip(".~")
    if not target:
        return None
    domain = env.get_domain("py")
    kinds = set(domain.objtypes_for_role(node.get("reftype", "obj")) or ())
    parts = target.split(".")
    # another package's name (``jax.grad``) is never shortened to one of ours
    ours = len(parts) == 1 or parts[0] == "cenlmc_jax"
    for k in range(len(parts) if ours else 1):
        suffix = ".".join(parts[k:])
        found = [
            name
            for name, entry in domain.objects.items()
            if not entry.aliased
            and (not kinds or entry.objtype in kinds)
            and (name == suffix or name.endswith("." + suffix))
        ]
        if found:
            shortest = min(len(n) for n in found)
            best = [n for n in found if len(n) == shortest]
            if len(best) != 1:
                return None
            entry = domain.objects[best[0]]
            return make_refnode(
                app.builder,
                node["refdoc"],
                entry.docname,
                entry.node_id,
                contnode,
                best[0],
            )
    return None


def _skip_namedtuple_fields(app, what, name, obj, skip, options):
    if (getattr(obj, "__doc__", None) or "").startswith("Alias for field number"):
        return True
    return None


def setup(app):
    app.connect("source-read", _drop_missing_toctree_entries)
    app.connect("source-read", _generate_performance)
    app.connect("env-get-outdated", _always_reread_performance)
    app.connect("env-check-consistency", _check_api_coverage)
    app.connect("missing-reference", _resolve_by_suffix)
    app.connect("autodoc-skip-member", _skip_namedtuple_fields)
