"""How long a lesson takes to read, by one stated rule (TEACHING.md's reading column; a test ties the two).

A lesson's **core path** is its cells before the *Summary* or *Going deeper* heading. Its reading minutes are
prose words / 150 + printed words / 200 + visible code lines / 10, counted on an executed copy (the reference run):
prose is its markdown, printed words its cells' text outputs (progress bars aside), visible code its non-blank code
lines. Code collapsed by the Jupyter conventions (``metadata.jupyter.source_hidden``, or the tags ``hide-input`` /
``remove-input`` that Jupyter Book and nbconvert read) counts no lines; its output still counts. Readers in a
workshop were measured about 15 % slower than the rule: a floor, not a ceiling.

    python -m course.reading reference-run
"""

from __future__ import annotations

import argparse
import ast
import builtins
import json
import re
from pathlib import Path

HIDDEN_TAGS = {"hide-input", "remove-input", "hide-cell", "remove-cell"}
LIMIT = 17  # minutes, each lesson's core path at most


def is_hidden(cell: dict) -> bool:
    """Whether a code cell's source is collapsed by the Jupyter conventions."""
    meta = cell.get("metadata", {})
    return bool(meta.get("jupyter", {}).get("source_hidden")) or bool(HIDDEN_TAGS & set(meta.get("tags", [])))


def reading(path: Path) -> dict:
    """The core path's prose words, printed words, visible and hidden code lines, and minutes by the rule."""
    prose = printed = code = hidden = 0
    for cell in json.loads(Path(path).read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            if re.match(r"#+\s*(summary|going deeper)", source, re.I):
                break
            prose += len(re.sub(r"[`*_#|>\-]", " ", source).split())
            continue
        if cell["cell_type"] != "code":
            continue
        lines = sum(1 for line in source.splitlines() if line.strip())
        hidden, code = (hidden + lines, code) if is_hidden(cell) else (hidden, code + lines)
        for output in cell.get("outputs", []):
            text = "".join(output.get("text") or output.get("data", {}).get("text/plain") or "")
            if "it/s]" in text or "s/it]" in text or "Loading weights" in text:
                continue
            printed += len(text.split())
    minutes = prose / 150 + printed / 200 + code / 10
    return dict(minutes=round(minutes, 1), prose=prose, printed=printed, code=code, hidden=hidden)


def _names(source: str) -> tuple[set[str], set[str]]:
    """The names a cell defines (assigned, imported, def/class, arguments) and those it reads."""
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))  # magics
    defined, used = set(), set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Name):
            (defined if isinstance(node.ctx, ast.Store) else used).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
    return defined, used


def out_of_sight(path: Path) -> dict[int, list[str]]:
    """Names a reader sees used but never sees defined: for each visible code cell (by index; *Going deeper*'s too),
    the names it reads that only collapsed cells define or import; empty when every name in sight is defined in sight.
    """
    seen, hidden_only, found = set(), set(), {}
    for index, cell in enumerate(json.loads(Path(path).read_text())["cells"]):
        if cell["cell_type"] != "code":
            continue
        defined, used = _names("".join(cell["source"]))
        if is_hidden(cell):
            hidden_only |= defined - seen
            continue
        leaks = sorted(n for n in used - defined - seen if n in hidden_only and not hasattr(builtins, n))
        if leaks:
            found[index] = leaks
        seen |= defined
    return found


def lessons(folder: Path) -> dict[str, dict]:
    """Each executed lesson in ``folder`` (NN_*.ipynb) by its number."""
    return {path.name[:2]: reading(path) for path in sorted(Path(folder).glob("[0-9][0-9]_*.ipynb"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default="reference-run", help="executed lessons (default: reference-run)")
    for number, counts in lessons(Path(parser.parse_args().folder)).items():
        print(number, counts)


if __name__ == "__main__":
    main()
