"""Size and shape of tuner/: the measures issue-style reviews ask for, from the code's own syntax tree.

    python3 tools/code_metrics.py [ROOT]     # ROOT defaults to tuner/

Prints lines, `Any` per 1,000 lines, `dict[str, Any]` per 1,000 lines, function-level imports per 1,000
lines (cli/'s lazy command loading counted apart), the calls that pass more than 6 positional arguments and
the functions that take more than 8 parameters.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path


def main(root: Path) -> int:
    lines = any_n = dict_any = 0
    fn_imports: list[str] = []
    cli_imports = 0
    wide_calls: list[str] = []
    wide_defs: list[str] = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        lines += text.count("\n")
        any_n += len(re.findall(r"\bAny\b", text))
        dict_any += len(re.findall(r"dict\[str, Any\]", text))
        tree = ast.parse(text)
        in_cli = "cli" in path.relative_to(root).parts[:1]
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            a = fn.args
            bound = bool(a.args) and a.args[0].arg in ("self", "cls")
            n_params = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) - bound
            if n_params > 8:
                wide_defs.append(f"{path}:{fn.lineno} {fn.name} ({n_params})")
            for node in ast.walk(fn):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    if in_cli:
                        cli_imports += 1
                    else:
                        fn_imports.append(f"{path}:{node.lineno}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and len(node.args) > 6:
                wide_calls.append(f"{path}:{node.lineno} ({len(node.args)} positional)")
    # nested functions are walked twice above; count each import once
    fn_imports = sorted(set(fn_imports))
    k = lines / 1000
    print(f"lines                         {lines}")
    print(f"Any per 1,000 lines           {any_n / k:.1f} ({any_n})")
    print(f"dict[str, Any] per 1,000      {dict_any / k:.1f} ({dict_any})")
    print(f"function-level imports /1,000 {len(fn_imports) / k:.1f} ({len(fn_imports)}; cli/ {cli_imports} more)")
    print(f"calls with > 6 positionals    {len(wide_calls)}")
    print(f"functions with > 8 params     {len(wide_defs)}")
    if "-v" in sys.argv:
        for line in wide_calls + wide_defs:
            print("  " + line)
    return 0


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "-v"]
    sys.exit(main(Path(args[0]) if args else Path("tuner")))
