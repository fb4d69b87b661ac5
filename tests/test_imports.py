"""The package's imports, read from the source: no module imports one that imports it back,
and no lower layer reaches up."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "convfit_jax"


def _modules() -> dict[str, Path]:
  out = {}
  for path in PACKAGE.rglob("*.py"):
    parts = path.relative_to(REPO).with_suffix("").parts
    out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
  return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
  """The package's modules that `name` imports, at the top or inside a function."""
  package = name if path.name == "__init__.py" else name.rpartition(".")[0]
  found = set()
  for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
    if isinstance(node, ast.Import):
      found |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        up = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(up + ([base] if base else []))
      # `from package import module` imports the module; `from module import name`, the module.
      found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
  return {m for m in found if m in modules and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """Strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on_stack, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while not component or component[-1] != v:
        component.append(stack.pop())
        on_stack.discard(component[-1])
      if len(component) > 1:
        out.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


def test_no_module_imports_one_that_imports_it_back():
  modules = _modules()
  graph = {name: _imports(name, path, modules) for name, path in modules.items()}
  assert "convfit_jax.encoder" in graph["convfit_jax.classifier"]  # the reader sees imports
  assert _cycles(graph) == []


# Each layer imports only those before it (and the shared helpers at the package's top:
# registry, tokenization, hf_io, sharding, atomic_files): data < models < evaluators; the
# trainers, tasks and the user-facing modules (encoder, classifier, serving) sit above them.
_LAYERS = ("data", "models", "evaluators")
_ABOVE = ("train", "tasks", "configs", "encoder", "classifier", "fine_tune", "serving", "main",
          "saved_classifier")


def test_no_lower_layer_imports_a_higher_one():
  modules = _modules()
  part = lambda m: m.split(".")[1] if "." in m else ""
  upward = []
  for name, path in modules.items():
    if part(name) not in _LAYERS:
      continue
    higher = set(_LAYERS[_LAYERS.index(part(name)) + 1:]) | set(_ABOVE)
    upward += [f"{name} -> {t}" for t in sorted(_imports(name, path, modules)) if part(t) in higher]
  assert upward == []


def test_the_check_finds_a_cycle():
  assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
