"""Every tensor a lesson or solution builds for the model is placed on the model's device.

A CPU-only machine cannot run a lesson on a GPU, so this reads the code instead: it follows, cell after cell, the
names bound to tensors built without a device (``torch.tensor(...)`` with no ``device=``, ``pad_left(...)``, and
what is computed from them) and fails when one reaches a model call (``model(...)``, ``model.generate(...)``)
without ``.to(...)``. On a GPU such a call stops with "Expected all tensors to be on the same device".
"""

from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest

from course.reference_run import sources

NOTEBOOKS = sources()
# Calls that build a tensor on the CPU unless told a device.
BUILDERS = {"tensor", "as_tensor", "full", "zeros", "ones", "empty", "arange", "randint", "randn", "rand", "pad_left"}
# Calls that build a tensor where their first argument lives.
ALIKE = {"ones_like", "zeros_like", "full_like", "empty_like", "stack", "cat"}
MOVES = {"to", "cuda"}
MODEL_NAMES = {"model"}


def _callee(node: ast.Call) -> str | None:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _is_model_call(node: ast.Call) -> bool:
    func = node.func
    if isinstance(func, ast.Name):
        return func.id in MODEL_NAMES
    return (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id in MODEL_NAMES
        and func.attr in ("generate", "forward", "__call__")
    )


class Placement:
    """Which names hold tensors built off the model's device, as the code runs top to bottom."""

    def __init__(self):
        self.unplaced: set[str] = set()
        self.problems: list[str] = []

    def off_device(self, node: ast.AST) -> bool:
        """Whether an expression evaluates to a tensor built without a device (or computed from one)."""
        if isinstance(node, ast.Name):
            return node.id in self.unplaced
        if isinstance(node, ast.Call):
            name = _callee(node)
            if name in MOVES and isinstance(node.func, ast.Attribute):
                return False
            if name in BUILDERS:
                return not any(keyword.arg == "device" for keyword in node.keywords)
            if name in ALIKE:
                return any(self.off_device(arg) for arg in node.args[:1]) and not any(
                    k.arg == "device" for k in node.keywords
                )
            if isinstance(node.func, ast.Attribute):  # a method of a tensor: mask.cumsum(-1), x.clamp(min=0)
                return self.off_device(node.func.value)
            return False
        if isinstance(node, ast.BinOp):
            return self.off_device(node.left) or self.off_device(node.right)
        if isinstance(node, (ast.Subscript, ast.Attribute)):
            return self.off_device(node.value)
        if isinstance(node, (ast.List, ast.Tuple)):
            return any(self.off_device(element) for element in node.elts)
        if isinstance(node, (ast.ListComp, ast.GeneratorExp)):
            return self.off_device(node.elt)
        return False

    def bind(self, target: ast.AST, off: bool) -> None:
        if isinstance(target, ast.Name):
            (self.unplaced.add if off else self.unplaced.discard)(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self.bind(element, off)

    def visit(self, tree: ast.AST, where: str) -> None:
        """Depth first, in source order: a call is checked against the bindings made before it."""
        placement = self

        class Visitor(ast.NodeVisitor):
            def visit_Assign(self, node: ast.Assign) -> None:
                self.visit(node.value)
                if isinstance(node.value, ast.Tuple) and all(isinstance(t, ast.Tuple) for t in node.targets):
                    for target in node.targets:  # a, b = x.to(d), y.to(d): element by element
                        for element, value in zip(target.elts, node.value.elts):
                            placement.bind(element, placement.off_device(value))
                else:
                    for target in node.targets:
                        placement.bind(target, placement.off_device(node.value))

            def visit_Call(self, node: ast.Call) -> None:
                if _is_model_call(node):
                    for argument in [*node.args, *(keyword.value for keyword in node.keywords)]:
                        if placement.off_device(argument):
                            placement.problems.append(
                                f"{where}, line {argument.lineno}: {ast.unparse(argument)[:60]} "
                                "reaches the model without .to(model.device)"
                            )
                self.generic_visit(node)

        Visitor().visit(tree)


def placement_problems(sources: list[str]) -> list[str]:
    placement = Placement()
    for index, source in enumerate(sources):
        lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
        placement.visit(ast.parse("\n".join(lines)), f"code cell {index}")
    return placement.problems


def code_sources(path: Path) -> list[str]:
    return [cell.source for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == "code"]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: f"{path.parent.name}/{path.stem}")
def test_every_tensor_for_the_model_is_on_its_device(notebook):
    problems = placement_problems(code_sources(notebook))
    assert not problems, f"{notebook.name}: " + "; ".join(problems)


# --- the checker itself: it must catch what fails on a GPU and pass what works there ----------------------------

CAUGHT = {
    "moved only after the call": "ids = torch.tensor([[1]])\nmodel(input_ids=ids)\nids = ids.to(d)",
    "a tensor built in the call": "model(input_ids=torch.tensor([[1, 2]]))",
    "a name bound to a CPU tensor": "ids = torch.tensor([[1, 2]])\nmodel(input_ids=ids, logits_to_keep=1)",
    "one derived from it": (
        "mask = torch.zeros((1, 2))\nmodel(input_ids=x, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))"
    ),
    "pad_left's pair": "ids, mask = pad_left(rows, 0)\nmodel(input_ids=ids, attention_mask=mask)",
    "a *_like of a CPU tensor": (
        "ids = torch.tensor([[1]], device=d)\n"
        "model.generate(input_ids=ids, attention_mask=torch.ones_like(torch.tensor([[1]])))"
    ),
    "inside a function": "def f(s):\n    return model(input_ids=torch.tensor([s]))",
    "across cells": ["ids = torch.tensor([[1, 2]])", "model(input_ids=ids)"],
    "an arange for positions": "model(input_ids=x, position_ids=torch.arange(3)[None])",
    "a stack of CPU rows": "model(input_ids=torch.stack([torch.tensor([1])]))",
}
PASSED = {
    "moved before the call": "ids = torch.tensor([[1]])\nids = ids.to(d)\nmodel(input_ids=ids)",
    "device= given": "model(input_ids=torch.tensor([[1, 2]], device=model.device))",
    "moved at the call": "ids = torch.full((1, 2), 0)\nmodel(input_ids=ids.to(model.device))",
    "moved after building": (
        "ids, mask = pad_left(rows, 0)\nids, mask = ids.to(model.device), mask.to(model.device)\n"
        "model(input_ids=ids, attention_mask=mask)"
    ),
    "rebound to a moved copy": "ids = torch.tensor([[1]])\nids = ids.to(d)\nmodel(input_ids=ids)",
    "a *_like of a placed tensor": (
        "ids = torch.tensor([[1]], device=d)\nmodel.generate(input_ids=ids, attention_mask=torch.ones_like(ids))"
    ),
    "helpers' own calls": "score_batched(model, tokenizer, scorer, prompts)",
    "a CPU tensor that never reaches the model": "mask = torch.zeros((2, 2))\nprint(mask.sum())",
}


def _sources(case) -> list[str]:
    return case if isinstance(case, list) else [case]


@pytest.mark.parametrize("case", CAUGHT, ids=str)
def test_the_placement_check_catches(case):
    assert placement_problems(_sources(CAUGHT[case])), f"not caught: {case}"


@pytest.mark.parametrize("case", PASSED, ids=str)
def test_the_placement_check_passes(case):
    assert placement_problems(_sources(PASSED[case])) == [], f"flagged although placed: {case}"
