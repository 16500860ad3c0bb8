"""The package's layering, checked with `ast` so it stays true (docs/architecture.md draws it).

Edges are runtime imports between pagedllm's top-level packages (a module directly under
pagedllm/ counts as a package of its own), wherever they occur, function bodies included.
Imports under `if TYPE_CHECKING:` are left out: they exist only for annotations and create no
dependency at run time.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pagedllm

ROOT = Path(pagedllm.__file__).parent

# package -> packages it must never import
FORBIDDEN = {
    # The scheduler's world: requests, blocks, step messages. No model, no device code.
    "core": {"model", "worker", "engine", "entrypoints", "loader", "kernels", "distributed",
             "speculative", "structured_output", "config", "lora", "data_parallel",
             "finetune", "pooling"},
    # Layers and models know nothing of how they are scheduled or served.
    "model": {"engine", "worker", "core", "entrypoints", "distributed", "speculative",
              "data_parallel", "config", "loader", "finetune"},
    # The runner's side: features hook into it from above, it never imports them.
    "worker": {"engine", "entrypoints", "distributed", "speculative", "data_parallel"},
    # Capabilities plug into the engine through hooks; they never import the engine.
    "speculative": {"engine", "entrypoints", "distributed", "data_parallel"},
    "lora": {"engine", "entrypoints", "worker", "core", "distributed", "speculative"},
    "pooling": {"engine", "entrypoints", "worker", "distributed", "speculative",
                "data_parallel"},
    "structured_output": {"engine", "entrypoints", "worker", "core", "model", "distributed"},
    "distributed": {"engine", "entrypoints", "speculative", "data_parallel"},
    "config": {"engine", "entrypoints", "worker", "distributed", "speculative",
               "data_parallel"},
    "engine": {"entrypoints", "data_parallel"},
}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "pagedllm"


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside `if TYPE_CHECKING:` blocks."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def import_edges() -> dict[tuple[str, str], list[str]]:
    """(importing package, imported package) -> where, for every pagedllm-internal import."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        src = _package(".".join(rel.parts))
        tree = ast.parse(path.read_text())
        skip = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                    node.module == "pagedllm" or node.module.startswith("pagedllm.")):
                targets = ([f"pagedllm.{a.name}" for a in node.names]
                           if node.module == "pagedllm" else [node.module])
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("pagedllm.")]
            else:
                continue
            for target in targets:
                dst = _package(target)
                is_module = (ROOT / dst).is_dir() or (ROOT / f"{dst}.py").is_file()
                if dst != src and is_module:  # not a name such as `from pagedllm import LLM`
                    edges[(src, dst)].append(f"{rel}.py:{node.lineno}")
    return edges


def _cycles(edges) -> list[list[str]]:
    """Strongly connected components of more than one package (Tarjan)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def test_no_package_level_import_cycle() -> None:
    edges = import_edges()
    cycles = _cycles(edges)
    detail = [f"{a} -> {b}: {where[:3]}" for (a, b), where in edges.items()
              if any(a in c and b in c for c in cycles)]
    assert not cycles, f"import cycles {cycles}:\n" + "\n".join(detail)


def test_forbidden_imports() -> None:
    bad = [f"{a} imports {b}: {where[:3]}" for (a, b), where in import_edges().items()
           if b in FORBIDDEN.get(a, ())]
    assert not bad, "\n".join(bad)


def test_the_checker_sees_edges() -> None:
    """The checker itself: it finds known edges, so an empty result above means something."""
    edges = import_edges()
    assert ("engine", "core") in edges and ("worker", "model") in edges
    assert _cycles({("a", "b"): [], ("b", "c"): [], ("c", "a"): [], ("c", "d"): []}) == [
        ["a", "b", "c"]]


# Underscore names that are other libraries' public API (os._exit, namedtuple's _replace,
# argparse's group type, torch's ISA probes).
_FOREIGN_PRIVATE_OK = {"_exit", "_replace", "_ArgumentGroup", "_is_mkldnn_bf16_supported",
                       "_is_mkldnn_fp16_supported"}


def test_no_private_member_used_across_objects() -> None:
    """`x._name` only on self / cls: another object's private members are its own business
    (an underscore name is not part of a class's contract)."""
    bad = []
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Call) and ast.unparse(owner.func) == "super":
                continue
            if node.attr in _FOREIGN_PRIVATE_OK:
                continue
            bad.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: {ast.unparse(node)}")
    assert not bad, "\n".join(bad)
