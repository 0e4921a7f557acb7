"""Module and function sizes of the package in lines of code (issue 19: "no module over
~600 lines and no function over ~80 lines of code, without a stated reason").

A line of code is a line holding a token other than a comment, and not part of a
docstring (the string statement that opens a module, class or function). Blank lines,
comments and docstrings are not counted. A function's count covers its whole body,
nested functions included.

    python benchmarks/code_size.py [--modules 600] [--functions 80]

writes ``benchmarks/results/code_size.{json,md}``: every module and function over its
limit, and whether its module docstring states a reason (a line containing ``Size:``).
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import os
import tokenize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "cenlmc_jax")
RESULTS = os.path.join(ROOT, "benchmarks", "results")
_SKIP = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
}


def _docstring_lines(tree: ast.AST) -> set:
    out = set()
    for node in ast.walk(tree):
        if (
            isinstance(
                node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
            )
            and node.body
        ):
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                out.update(range(first.lineno, first.end_lineno + 1))
    return out


def code_lines(source: str) -> set:
    """The line numbers holding code (module docstring)."""
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in _SKIP:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return lines - _docstring_lines(ast.parse(source))


def measure(path: str) -> dict:
    with open(path, encoding="utf-8") as fh:
        source = fh.read()
    tree = ast.parse(source)
    code = code_lines(source)
    functions = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            n = len([line for line in code if start <= line <= node.end_lineno])
            functions.append({"name": node.name, "line": node.lineno, "code_lines": n})
    doc = ast.get_docstring(tree) or ""
    return {
        "module": os.path.relpath(path, ROOT),
        "code_lines": len(code),
        "total_lines": source.count("\n"),
        "functions": functions,
        "size_reason": next(
            (ln.strip() for ln in doc.splitlines() if "Size:" in ln), None
        ),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--modules", type=int, default=600)
    ap.add_argument("--functions", type=int, default=80)
    args = ap.parse_args(argv)
    modules = []
    for folder, _, files in os.walk(PACKAGE):
        modules += [
            measure(os.path.join(folder, f)) for f in sorted(files) if f.endswith(".py")
        ]
    modules.sort(key=lambda m: -m["code_lines"])
    big_modules = [m for m in modules if m["code_lines"] > args.modules]
    big_functions = sorted(
        (
            {"module": m["module"], **f, "size_reason": m["size_reason"]}
            for m in modules
            for f in m["functions"]
            if f["code_lines"] > args.functions
        ),
        key=lambda f: -f["code_lines"],
    )
    report = {
        "limits": {
            "module_code_lines": args.modules,
            "function_code_lines": args.functions,
        },
        "num_modules": len(modules),
        "largest_modules": [
            {k: m[k] for k in ("module", "code_lines", "total_lines", "size_reason")}
            for m in modules[:10]
        ],
        "modules_over": [m["module"] for m in big_modules],
        "functions_over": big_functions,
    }
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "code_size.json"), "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1)
    md = [
        "# Code size (`python benchmarks/code_size.py`): lines of code, without "
        "docstrings, comments, blanks",
        "",
        f"{len(modules)} modules. Limits: {args.modules} per module, {args.functions} "
        "per function.",
        "",
        "| largest modules | code lines | total lines | stated reason |",
        "|---|---|---|---|",
    ]
    md += [
        f"| `{m['module']}` | {m['code_lines']} | {m['total_lines']} | "
        f"{m['size_reason'] or ''} |"
        for m in modules[:10]
    ]
    md += [
        "",
        f"Functions over {args.functions} lines of code: {len(big_functions)}",
        "",
    ]
    if big_functions:
        md += ["| function | code lines | module's stated reason |", "|---|---|---|"]
        md += [
            f"| `{f['module']}:{f['line']}` `{f['name']}` | {f['code_lines']} | "
            f"{f['size_reason'] or ''} |"
            for f in big_functions
        ]
    with open(os.path.join(RESULTS, "code_size.md"), "w", encoding="utf-8") as fh:
        fh.write("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
