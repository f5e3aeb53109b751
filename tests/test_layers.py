"""The house's layering: no import cycle between modules, and no module imports from a higher layer.

Every ``import`` in every module of ``mdl_jax`` (the library) and ``mdl_repro`` (the paper's reproduction,
``repro/``) counts, function-level ones included (they are real dependencies, only deferred). The layers,
lowest first, are the ones the docs' Architecture page draws; the reproduction's sit above all of the
library's, so the library can never import it. A failure names both files and the imported names, so the
fix (move the piece to the floor it belongs on) is plain.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "mdl_jax"
REPRO_PKG = PKG.parent / "repro" / "mdl_repro"

# The old names of what moved to the reproduction: one-line stubs that import ``mdl_jax._moved``, which
# resolves them to the moved modules only when a user imports an old name (deprecated, one release).
ALIASES = ("mdl_jax._moved", "mdl_jax.pipeline", "mdl_jax.analysis", "mdl_jax.serving.model_server",
           "mdl_jax.serve")

# (layer, module prefixes), lowest first. A module belongs to the layer of its longest matching prefix;
# "mdl_jax" alone is the package's __init__, which re-exports the controller.
LAYERS = [
    ("foundation", ("mdl_jax.runtime", "mdl_jax._fs", "mdl_jax._io", "mdl_jax._paths",
                    "mdl_jax._version", "mdl_jax.prompts", "mdl_jax.strict_json", *ALIASES)),
    ("controller", ("mdl_jax", "mdl_jax.controller")),
    ("engines", ("mdl_jax.engines",)),
    ("signals", ("mdl_jax.signals",)),
    ("gate", ("mdl_jax.gate",)),
    ("evaluation", ("mdl_jax.evaluation",)),
    ("serving, integrations", ("mdl_jax.serving", "mdl_jax.integrations")),
    ("command line", ("mdl_jax.cli", "mdl_jax.__main__")),
    # the reproduction (repro/), above the whole library
    ("reproduction: pipeline, model server", ("mdl_repro", "mdl_repro._version", "mdl_repro.timing",
                                              "mdl_repro.pipeline", "mdl_repro.model_server")),
    ("reproduction: analysis", ("mdl_repro.analysis",)),
    ("reproduction: command line", ("mdl_repro.cli", "mdl_repro.serve")),
]
LIBRARY = "command line"  # the highest layer of the library


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in (PKG, REPRO_PKG):
        for p in pkg.rglob("*.py"):
            parts = p.relative_to(pkg.parent).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            mods[name] = p
    return mods


MODULES = _modules()


def layer_of(module: str) -> int:
    best, rank = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for pre in prefixes:
            hit = module == pre or (pre not in ("mdl_jax", "mdl_repro") and module.startswith(pre + "."))
            if hit and len(pre) > best:
                best, rank = len(pre), i
    if rank is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS (and to the docs' diagram)")
    return rank


def imported_from(module: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    """The absolute name of the module a ``from ... import`` in ``module`` reads from (relative
    imports resolved against ``module``'s package)."""
    if not node.level:
        return node.module or ""
    pkg = module.split(".") if is_pkg else module.split(".")[:-1]
    pkg = pkg[:len(pkg) - (node.level - 1)]
    return ".".join(pkg + ([node.module] if node.module else []))


def imports_of(module: str) -> dict[str, set[str]]:
    """{imported first-party module: names imported from it} for every import statement in ``module``."""
    path = MODULES[module]
    is_pkg = path.name == "__init__.py"
    out: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        targets: list[tuple[str, str]] = []
        if isinstance(node, ast.Import):
            targets = [(a.name, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = imported_from(module, is_pkg, node)
            for a in node.names:
                sub = f"{base}.{a.name}"
                targets.append((sub, a.name) if sub in MODULES else (base, a.name))
        for target, name in targets:
            if not target.startswith(("mdl_jax", "mdl_repro")):
                continue
            while target not in MODULES and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in MODULES and target != module:
                out.setdefault(target, set()).add(name)
    return out


GRAPH = {m: imports_of(m) for m in MODULES}


def _rel(module: str) -> str:
    return MODULES[module].relative_to(PKG.parent).as_posix()


def test_no_controller_module_imports_the_engines():
    # The engines load by name when a call asks for one (controller.api.engine_module); a static import,
    # function-level included, would make the controller depend on them.
    bad = [f"{_rel(m)} imports {', '.join(sorted(names))} from {_rel(t)}"
           for m in sorted(MODULES) if layer_of(m) == layer_of("mdl_jax.controller")
           for t, names in sorted(GRAPH[m].items()) if t == "mdl_jax.engines" or t.startswith("mdl_jax.engines.")]
    assert not bad, "controller modules that import the engines:\n" + "\n".join(bad)


def test_the_signals_definition_imports_no_compiled_library():
    # memory_signals' default engine is the JAX pass (signals/jax_pass.py): it, and the modules it
    # imports, import neither an engine nor a C++ helper of the signals, function-level included
    native = ("mdl_jax.engines", "mdl_jax.signals.dots_native", "mdl_jax.signals.conflict_native")
    seen, todo, bad = set(), ["mdl_jax.signals.jax_pass"], []
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        for t in GRAPH.get(m, {}):
            if t == native[0] or t.startswith(native[0] + ".") or t in native[1:]:
                bad.append(f"{_rel(m)} imports {_rel(t)}")
            elif t.startswith("mdl_jax."):
                todo.append(t)
    assert not bad, "the signals' definition reaches a compiled library:\n" + "\n".join(bad)
    assert "mdl_jax.signals.conflict" in seen  # the walk reached the detector it imports


def test_every_module_has_a_layer():
    for m in MODULES:
        layer_of(m)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_from_a_higher_layer(module):
    mine = layer_of(module)
    bad = [f"{_rel(module)} ({LAYERS[mine][0]}) imports {', '.join(sorted(names))} from {_rel(t)} "
           f"({LAYERS[layer_of(t)][0]})"
           for t, names in sorted(GRAPH[module].items()) if layer_of(t) > mine]
    assert not bad, "imports that run upward:\n" + "\n".join(bad)


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on, stack, comps = set(), [], []
    counter = 0
    for root in sorted(GRAPH):
        if root in index:
            continue
        work = [(root, iter(sorted(GRAPH[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(GRAPH[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        comps.append(sorted(comp))
    return comps


def test_no_import_cycles():
    msgs = []
    for comp in _cycles():
        edges = [f"  {_rel(a)} imports {', '.join(sorted(GRAPH[a][b]))} from {_rel(b)}"
                 for a in comp for b in sorted(GRAPH[a]) if b in comp]
        msgs.append(f"a cycle of {len(comp)} files:\n" + "\n".join(edges))
    assert not msgs, "\n".join(msgs)


def test_the_checker_sees_cycles_and_upward_imports():
    # The checks above would pass vacuously if the graph were empty or the layers misread.
    assert GRAPH["mdl_jax.cli"], "the command line imports nothing?"
    assert layer_of("mdl_repro.analysis.oracle") > layer_of("mdl_jax.cli.gate") > layer_of("mdl_jax.gate.core")
    assert GRAPH["mdl_repro.cli"] and "mdl_jax.cli.args" in GRAPH["mdl_repro.cli"]
    assert layer_of("mdl_jax.controller.api") == layer_of("mdl_jax") < layer_of("mdl_jax.signals.risk")
    saved = dict(GRAPH)
    try:
        GRAPH["mdl_jax.controller.config"] = {**GRAPH["mdl_jax.controller.config"],
                                              "mdl_jax.controller.api": {"decide"}}
        assert any("mdl_jax.controller.config" in c for c in _cycles())
    finally:
        GRAPH.clear()
        GRAPH.update(saved)


def test_the_library_never_imports_the_command_line():
    users = [_rel(m) for m, deps in GRAPH.items() if layer_of(m) < layer_of("mdl_jax.cli")
             and any(t == "mdl_jax.cli" or t.startswith("mdl_jax.cli.") for t in deps)]
    assert not users, f"the command line is imported from below by {users}"


def test_the_library_never_imports_the_reproduction():
    # The seam of the two distributions: ``pip install mdl-jax`` must work without mdl_repro, so no
    # library module imports it, statically or by a name in a string, except the deprecated aliases'
    # resolver (``mdl_jax._moved``), which imports it only when a user imports an old name.
    library = [m for m in MODULES if m.startswith("mdl_jax")]
    assert library and all(layer_of(m) <= layer_of("mdl_jax.cli") for m in library)
    static = [f"{_rel(m)} imports {t}" for m in library for t in GRAPH[m] if t.startswith("mdl_repro")]
    by_name = []
    for m in library:
        if m == "mdl_jax._moved":
            continue
        tree = ast.parse(MODULES[m].read_text(encoding="utf-8"))
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, ast.Module | ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)
                and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        by_name += [f"{_rel(m)}:{n.lineno} names {n.value!r}" for n in ast.walk(tree)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
                    and "mdl_repro" in n.value]
    assert not static and not by_name, "the library reaches into the reproduction:\n" + "\n".join(static + by_name)


def test_the_reproduction_sits_above_the_whole_library():
    top = max(layer_of(m) for m in MODULES if m.startswith("mdl_jax"))
    assert LAYERS[top][0] == LIBRARY
    assert all(layer_of(m) > top for m in MODULES if m.startswith("mdl_repro"))
    assert "mdl_repro.pipeline.data" in MODULES and "mdl_repro.analysis.oracle" in MODULES


def test_evaluation_sits_between_the_gate_and_the_pipeline():
    # The harness may use the gate and the signals; the pipeline (and the reproduction) may use the harness.
    ev = layer_of("mdl_jax.evaluation.datasets.registry")
    assert layer_of("mdl_jax.gate.core") < ev < layer_of("mdl_repro.pipeline.data")
    assert "mdl_jax.evaluation.datasets.paper_sets" in GRAPH["mdl_repro.pipeline.data"]


# --- private names stay in their module ----------------------------------------------------------

ROOT = PKG.parent

def _first_party() -> dict[str, Path]:
    mods = {}
    for base, top in ((ROOT, "mdl_jax"), (ROOT, "experiments"), (ROOT / "repro", "mdl_repro")):
        for p in (base / top).rglob("*.py"):
            parts = p.relative_to(base).with_suffix("").parts
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
        for d in (base / top).rglob("*"):  # packages without Python (mdl_jax/engines/_native) are modules too
            if d.is_dir() and d.name != "__pycache__":
                mods.setdefault(".".join(d.relative_to(base).parts), d)
    return mods


def private_uses(module: str, mods: dict[str, Path]) -> list[tuple[str, str]]:
    """(defining module, private name) for every ``from x import _y`` and ``x._y`` in ``module``
    where x is another first-party module and ``_y`` is a name in it, not a module of its own."""
    path = mods[module]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    is_pkg = path.name == "__init__.py"
    bound: dict[str, str] = {}  # local name -> first-party module it is bound to
    found: list[tuple[str, str]] = []

    def private(name: str) -> bool:
        return name.startswith("_") and not name.startswith("__")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in mods:
                    bound[a.asname or a.name] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = imported_from(module, is_pkg, node)
            if base not in mods:
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in mods:
                    bound[a.asname or a.name] = sub
                elif private(a.name) and base != module:
                    found.append((base, a.name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr) and isinstance(node.value, ast.Name):
            target = bound.get(node.value.id)
            if target and target != module and f"{target}.{node.attr}" not in mods:
                found.append((target, node.attr))
    return found


def test_no_module_uses_another_modules_private_names():
    """What sibling modules share has a public name; a leading underscore means "this module only".

    Checked over mdl_jax/, repro/mdl_repro/ and experiments/: ``from x import _y`` and ``x._y`` where x is another
    first-party module. Importing a private *module* (``mdl_jax._io``, ``_paths``, ``_version``,
    ``experiments._machine``) is allowed: the underscore there marks a module the package
    keeps to itself, and it is a module, not a name taken from one. Tests may reach inside modules."""
    mods = _first_party()
    rel = {m: p.relative_to(ROOT).as_posix() for m, p in mods.items()}
    bad = sorted(f"{rel[m]} uses {d}.{name}" for m, p in mods.items() if p.suffix == ".py"
                 for d, name in private_uses(m, mods))
    assert not bad, "private names used across modules (give the shared piece a public name):\n" + "\n".join(bad)


def test_the_private_name_check_sees_both_spellings(tmp_path):
    mods = _first_party()
    fake = tmp_path / "fake.py"
    fake.write_text("from mdl_jax import _io\nfrom mdl_jax.signals import conflict as c\n"
                    "from mdl_jax.gate.core import _unit\nx = c._analyse\ny = c.analyse\n")
    mods = {**mods, "fake": fake}
    assert sorted(private_uses("fake", mods)) == [("mdl_jax.gate.core", "_unit"), ("mdl_jax.signals.conflict", "_analyse")]
