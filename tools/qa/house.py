"""Counts of the package's shape, for docs/ARCHITECTURE.md ("The shape of the package, measured").

    python tools/qa/house.py                 # the working tree
    python tools/qa/house.py --rev 6954312   # a commit (read with `git archive`)
    python tools/qa/house.py --quick         # the working tree, what the test suite runs

Prints: root modules of ``pipecompile/``, functions below the surfaces that take a parsed
``argparse.Namespace``, modules of ``pipecompile/compiler/`` importing the runtime, Python
files per folder (``pipecompile/`` and
``passes/``), parameters typed as a manifest dict (``manifest...: dict``/``Mapping``), the
``# fmt: skip`` comments in the package, how many places spell ``"manifest.json"`` and
``"metrics.jsonl"``, the pairs of places in the package that share six or more
consecutive lines (after stripping indentation, blank lines and comments), the lines of
``cli.py``, the functions over 80 lines, ``compile_model``'s parameters, the parameters
named ``model`` that are a cost model, and the public names defined in several modules, the
files at the top of ``runtime/``, its functions over 8 parameters, ``dict[str, Any]`` in the
package and the package files naming a schedule besides ``schedules/``.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pipecompile", "passes")
MANIFEST_DICT = re.compile(r"manifest[a-z_]*: ?(dict|Mapping)\b")
WINDOW = 6  # lines a copy must share to count


def sources(tree: Path) -> dict[Path, list[str]]:
    """Every Python file of the package, by path relative to ``tree``."""
    found = {}
    for package in PACKAGES:
        for path in sorted((tree / package).rglob("*.py")):
            found[path.relative_to(tree)] = path.read_text().splitlines()
    return found


def copied_pairs(files: dict[Path, list[str]]) -> int:
    """Pairs of files (or of distant places in one file) sharing ``WINDOW`` meaningful lines."""
    places: dict[tuple[str, ...], list[tuple[Path, int]]] = defaultdict(list)
    for path, lines in files.items():
        kept = [(n, ln.strip()) for n, ln in enumerate(lines) if _meaningful(ln)]
        for k in range(len(kept) - WINDOW + 1):
            window = tuple(text for _, text in kept[k : k + WINDOW])
            places[window].append((path, kept[k][0]))
    pairs: set[tuple[Path, int, Path, int]] = set()
    for where in places.values():
        for a in range(len(where)):
            for b in range(a + 1, len(where)):
                (pa, la), (pb, lb) = where[a], where[b]
                if pa == pb and abs(la - lb) < WINDOW:
                    continue  # one run of repeated lines, not a copy
                pairs.add((pa, la // 50, pb, lb // 50))  # one pair per region of a file
    return len({(pa, pb, ra, rb) for pa, ra, pb, rb in pairs})


def _meaningful(line: str) -> bool:
    text = line.strip()
    return bool(text) and not text.startswith("#") and text not in (")", "]", "}", '"""')


def functions(files: dict[Path, list[str]]) -> list[tuple[Path, ast.FunctionDef]]:
    """Every function of the package (methods and nested ones included)."""
    found = []
    for path, lines in files.items():
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((path, node))
    return found


def _params(node: ast.FunctionDef) -> list[ast.arg]:
    a = node.args
    return [*a.posonlyargs, *a.args, *a.kwonlyargs]


def shape_of_options(files: dict[Path, list[str]]) -> dict[str, object]:
    """How options travel and how big the rooms are: the figures of one options object."""
    defs = functions(files)
    driver = [n for p, n in defs if n.name == "compile_model" and p.name == "driver.py"]
    places = ("pipecompile/cli.py", "pipecompile/surfaces/cli.py")
    cli = next((lines for p, lines in files.items() if str(p) in places), [])
    return {
        "lines of the command line's cli.py": len(cli),
        "functions over 80 lines": sum(n.end_lineno - n.lineno + 1 > 80 for _, n in defs),
        "compile_model's parameters": len(_params(driver[0])) if driver else "-",
        "parameters `model` typed as a CostModel": sum(
            a.arg == "model"
            and a.annotation is not None
            and "CostModel" in ast.unparse(a.annotation)
            for _, n in defs
            for a in _params(n)
        ),
    }


SCHEDULE_NAMES = re.compile(
    r"\b(gpipe|1f1b|pipedream|pipedream_2bw|interleaved|zb1p|zb2p|looped_bfs|zbv|v_half|"
    r"v_min|dualpipev)\b"
)


def names_and_rooms(files: dict[Path, list[str]]) -> dict[str, object]:
    """One meaning per name, rooms that say what they hold, typed values: the public names
    defined in several modules (each entry point's ``main`` aside), the files at the top of
    ``runtime/``, its functions over 8 parameters (``self`` aside), ``dict[str, Any]`` in
    the package and the package files naming a schedule besides ``schedules/``."""
    defined: dict[str, set[Path]] = defaultdict(set)
    for path, lines in files.items():
        for node in ast.parse("\n".join(lines)).body:
            kinds = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
            if isinstance(node, kinds) and not node.name.startswith("_") and node.name != "main":
                defined[node.name].add(path)
    runtime = [(p, n) for p, n in functions(files) if p.parts[:2] == ("pipecompile", "runtime")]
    return {
        "public names defined in several modules": sum(len(v) > 1 for v in defined.values()),
        "files at the top of runtime/": sum(
            1 for p in files if p.parent == Path("pipecompile/runtime") and p.name != "__init__.py"
        ),
        "functions in runtime/ over 8 parameters": sum(
            len([a for a in _params(n) if a.arg not in ("self", "cls")])
            + bool(n.args.vararg)
            + bool(n.args.kwarg)
            > 8
            for _, n in runtime
        ),
        "dict[str, Any] in the package": sum(
            ln.count("dict[str, Any]") for lines in files.values() for ln in lines
        ),
        "package files naming a schedule besides schedules/": sum(
            any(SCHEDULE_NAMES.search(ln) for ln in lines)
            for p, lines in files.items()
            if p.parts[:2] != ("pipecompile", "schedules")
        ),
    }


def counts(tree: Path) -> dict[str, object]:
    files = sources(tree)
    folders = Counter(str(path.parent) for path in files)
    spelled = {
        name: sum(f'"{name}"' in "\n".join(lines) for lines in files.values())
        for name in ("manifest.json", "metrics.jsonl")
    }
    # the surfaces: their room, or (before it) the package's root modules
    below = {
        p: lines
        for p, lines in files.items()
        if "surfaces" not in p.parts and str(p.parent) != "pipecompile"
    }
    return {
        "root modules": sum(1 for p in files if str(p.parent) == "pipecompile"),
        "functions below the surfaces taking a parsed namespace": sum(
            a.annotation is not None and "Namespace" in ast.unparse(a.annotation)
            for _, n in functions(below)
            for a in _params(n)
        ),
        "compiler modules importing the runtime": sum(
            any(re.match(r"\s*(from|import) pipecompile\.runtime\b", ln) for ln in lines)
            for p, lines in files.items()
            if p.parts[:2] == ("pipecompile", "compiler")
        ),
        "files per folder": dict(sorted(folders.items())),
        "manifest dict signatures": sum(
            len(MANIFEST_DICT.findall(ln)) for lines in files.values() for ln in lines
        ),
        "# fmt: skip in the package": sum(
            ln.count("# fmt: skip") for lines in files.values() for ln in lines
        ),
        "files spelling each name": spelled,
        f"copied regions ({WINDOW}+ lines)": copied_pairs(files),
        **shape_of_options(files),
        **names_and_rooms(files),
    }


def checkout(rev: str, into: Path) -> Path:
    """The package at commit ``rev``, unpacked under ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, *PACKAGES], capture_output=True, check=False
    )
    if archive.returncode != 0:
        sys.exit(f"house.py: cannot read commit {rev!r}: {archive.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


def show(name: str, values: dict[str, object]) -> None:
    print(f"== {name}")
    for key, value in values.items():
        if isinstance(value, dict):
            print(f"{key}:")
            for inner, count in value.items():
                print(f"  {inner}: {count}")
        else:
            print(f"{key}: {value}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", help="count this commit instead of the working tree")
    parser.add_argument("--quick", action="store_true", help="the working tree only")
    args = parser.parse_args(argv)
    if args.rev and not args.quick:
        with tempfile.TemporaryDirectory() as tmp:
            show(f"commit {args.rev}", counts(checkout(args.rev, Path(tmp))))
    show("working tree", counts(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
