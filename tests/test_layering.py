"""The package's import structure: no import circles, and layers that only import downwards.

The import graph is read from the source with ``ast`` (nothing is imported). An import is
counted by where it sits: at module level (runs when the module is imported), inside a
function (runs when the function is called: deferred, but still a dependency at run time),
or under ``if TYPE_CHECKING:`` (never runs: annotations only). Importing ``a.b.c`` also runs
``a/b/__init__.py``, so that package counts as imported too (a package whose ``__init__``
imports its modules ties every importer of one of them to all of them).

Layers, bottom first (a module may import its own layer and the layers below it):

- foundation: plain data and helpers every part needs (findings, events, errors, atomic
  writes, "is this the user's code?");
- engine: the session, the check registry, code selection and configuration;
- features: instrumentation, checks, crash explanations, reporters and each command's
  machinery (perf, data, ckpt, env, keras, preflight, distributed);
- entry points: the command-line modules, the public API and the framework integrations.

Run ``python tests/test_layering.py [SRC_DIR]`` for the numbers (circles, upward imports).
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# Prefix -> layer; the longest matching prefix wins (module names without "nndoctor.").
FOUNDATION, ENGINE, FEATURES, ENTRY = 0, 1, 2, 3
LAYER_NAMES = ("foundation", "engine", "features", "entry points")
LAYERS: dict[str, int] = {
    **dict.fromkeys(
        ("run._startup", "core._version", "util.errors", "core.findings", "core.events", "util.limits", "run.streams",
         "core.tracebacks", "util.atomic", "core.suppression", "core.user_code", "core.optimizers", "util.sanitize",
         # The catalog as data (no check imported) and the subscriber protocol.
         "catalog.table", "catalog.entries", "core.subscribers", "core.rules.image_batches", "core.rules.loss_trend", "core.rules.initial_loss", "core.rules.chance_level", "util.protowire", "core.stash", "core.probes", "run.crash_context",
         # Pure rules a PyTorch check and its Keras variant share (thresholds, verdicts).
         "core.rules.gradient_explosion", "core.rules.dead_units",
         "util.dtensor"),
        FOUNDATION,
    ),
    **dict.fromkeys(("core.registry", "core.engine", "core.selection", "core.config"), ENGINE),
    **dict.fromkeys(
        ("instrument", "checks", "commands.explain", "report", "commands.perf", "commands.data", "commands.ckpt", "commands.env", "keras", "tfdata",
         "commands.preflight", "run.distributed", "run.history", "run.watchdog", "run.signals", "run.guards", "run.end", "run.runner", "commands.fix"),
        FEATURES,
    ),
    **dict.fromkeys(
        ("", "__main__", "cli", "catalog.cli", "catalog.update", "run.cli", "integrations.api", "integrations.base", "integrations.lightning",
         "integrations.transformers", "integrations.pytest_plugin", "integrations.notebook", "commands.demo",
         # Each command's front end: argument parsing, output, exit status.
         "commands.perf.cli", "commands.data.cli", "commands.data.__main__", "commands.ckpt.cli", "commands.ckpt.convert_cmd", "commands.ckpt.diff_cmd",
         "commands.ckpt.fix_cmd", "commands.ckpt.inspect_cmd", "commands.explain.cli", "commands.env.cli", "commands.preflight.cli", "commands.fix.cli"),
        ENTRY,
    ),
}

# Imports allowed to point upwards, at most one: (importer, imported) -> why. None is needed
# today; an entry must say why the import cannot go the other way.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Import:
    source: str  # importing module, without the "nndoctor." prefix ("" is the package itself)
    target: str
    line: int
    kind: str  # "module", "function" or "typing"


def _short(name: str) -> str:
    return name[len("nndoctor."):] if name.startswith("nndoctor.") else ("" if name == "nndoctor" else name)


def find_modules(src: Path) -> dict[str, tuple[Path, bool]]:
    """Module name (short) -> (file, is a package ``__init__``)."""
    found = {}
    for path in sorted((src / "nndoctor").rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        found[_short(".".join(parts))] = (path, is_package)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _ImportCollector(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool, modules: dict) -> None:
        self.module, self.is_package, self.modules = module, is_package, modules
        self.kind = "module"
        self.found: list[Import] = []

    def _with_kind(self, kind: str, nodes) -> None:
        outer, self.kind = self.kind, kind
        for node in nodes:
            self.visit(node)
        self.kind = outer

    def visit_FunctionDef(self, node) -> None:
        self._with_kind("function" if self.kind == "module" else self.kind, node.body)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            self._with_kind("typing", node.body)
            self._with_kind(self.kind, node.orelse)
        else:
            self.generic_visit(node)

    def _resolve(self, dotted: str) -> str:
        """The module an imported name lives in (the longest known prefix)."""
        name = _short(dotted)
        while name not in self.modules:  # "" (the package itself) is always there
            name = name.rpartition(".")[0]
        return name

    def _add(self, dotted: str, line: int) -> None:
        if not (dotted == "nndoctor" or dotted.startswith("nndoctor.")):
            return
        target = self._resolve(dotted)
        if target == self.module:
            return
        self.found.append(Import(self.module, target, line, self.kind))
        # Importing a.b.c runs a/b/__init__.py first (unless the importer is inside a.b).
        parts = target.split(".")
        for depth in range(1, len(parts)):
            package = ".".join(parts[:depth])
            inside = self.module == package or self.module.startswith(package + ".")
            if not inside and self.modules.get(package, (None, False))[1]:
                self.found.append(Import(self.module, package, line, self.kind))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = ("nndoctor." + self.module if self.module else "nndoctor").split(".")
            if not self.is_package:
                base = base[:-1]
            base = base[: len(base) - (node.level - 1)]
            package = ".".join(base + ([node.module] if node.module else []))
        else:
            package = node.module or ""
        for alias in node.names:
            # ``from nndoctor import events`` imports a module; ``from x import name``, a name in x.
            submodule = f"{package}.{alias.name}"
            self._add(submodule if _short(submodule) in self.modules else package, node.lineno)


def import_graph(src: Path = SRC) -> tuple[dict[str, tuple[Path, bool]], list[Import]]:
    modules = find_modules(src)
    imports: list[Import] = []
    for name, (path, is_package) in modules.items():
        collector = _ImportCollector(name, is_package, modules)
        collector.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        imports.extend(collector.found)
    return modules, imports


def layer_of(module: str) -> int | None:
    name = module
    while True:
        if name in LAYERS:
            return LAYERS[name]
        if not name:
            return None
        name = name.rpartition(".")[0]


def circles(modules, imports: list[Import], kinds: set[str]) -> list[list[str]]:
    """Strongly connected groups (more than one module) of the graph of ``kinds`` imports."""
    edges = defaultdict(set)
    for imp in imports:
        if imp.kind in kinds:
            edges[imp.source].add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(modules)))
    try:
        for node in sorted(modules):
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(groups)


def upward(imports: list[Import], kinds: set[str]) -> list[Import]:
    found = []
    for imp in imports:
        source, target = layer_of(imp.source), layer_of(imp.target)
        if imp.kind in kinds and source is not None and target is not None and target > source:
            found.append(imp)
    return found


def _where(imp: Import) -> str:
    return f"nndoctor.{imp.source or '__init__'}:{imp.line} -> nndoctor.{imp.target} ({imp.kind})"


RUNTIME = {"module", "function"}


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_the_graph_sees_the_package(graph):
    modules, imports = graph
    # A broken reader would find nothing and pass every test below.
    assert len(modules) > 100
    assert Import("core.engine", "core.registry", _line_of("core/engine.py", "from nndoctor.core.registry"), "module") in imports
    assert any(i.source == "core.registry" and i.target == "core.engine" and i.kind == "typing" for i in imports)
    # Importing a submodule runs its package's __init__.
    assert any(i.source == "run.runner" and i.target == "instrument" for i in imports)


def _line_of(relative: str, text: str) -> int:
    lines = (SRC / "nndoctor" / relative).read_text(encoding="utf-8").splitlines()
    return next(n for n, line in enumerate(lines, 1) if line.startswith(text))


def test_every_module_has_a_layer(graph):
    modules, _ = graph
    missing = sorted(f"nndoctor.{m}" for m in modules if layer_of(m) is None)
    assert not missing, f"add these to LAYERS in tests/test_layering.py: {missing}"


def test_no_import_circles(graph):
    modules, imports = graph
    assert circles(modules, imports, {"module"}) == []
    # A circle broken by a function-level import still ties the two modules together.
    found = circles(modules, imports, RUNTIME)
    assert not found, "import circles (module-level and deferred imports): " + "; ".join(
        " <-> ".join(group) for group in found
    )


def test_no_upward_imports(graph):
    _, imports = graph
    unexpected = [
        f"{_where(imp)}: {LAYER_NAMES[layer_of(imp.source)]} imports {LAYER_NAMES[layer_of(imp.target)]}"
        for imp in upward(imports, RUNTIME | {"typing"})
        if (imp.source, imp.target) not in ALLOWED_UPWARD
    ]
    assert not unexpected, "\n".join(unexpected)


def test_allowed_upward_import_is_still_needed(graph):
    _, imports = graph
    seen = {(imp.source, imp.target) for imp in upward(imports, RUNTIME | {"typing"})}
    assert len(ALLOWED_UPWARD) <= 1
    stale = set(ALLOWED_UPWARD) - seen
    assert not stale, f"no longer imported, remove from ALLOWED_UPWARD: {stale}"


PERF_BACKENDS = ("commands.perf.torch", "commands.perf.tf")


def _in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_perf_backends_import_each_other_never_and_neutral_perf_only_lazily(graph):
    # perf/torch and perf/tf are the frameworks' perf backends (perf/backend.py): neither knows the
    # other (a TensorFlow run never imports torch), and the framework-neutral perf modules reach
    # them only inside functions, so importing perf imports no framework's machinery.
    _, imports = graph
    crossed = [_where(i) for i in imports for ours, theirs in (PERF_BACKENDS, PERF_BACKENDS[::-1])
               if _in_package(i.source, ours) and _in_package(i.target, theirs)]
    assert not crossed, crossed
    neutral = [_where(i) for i in imports if i.kind == "module" and _in_package(i.source, "commands.perf")
               and not any(_in_package(i.source, b) for b in PERF_BACKENDS)
               and any(_in_package(i.target, b) for b in PERF_BACKENDS)]
    assert not neutral, neutral
    # The rule has something to check: the neutral session reaches both backends (lazily).
    assert {b for i in imports if i.source == "commands.perf.session" for b in PERF_BACKENDS if _in_package(i.target, b)} \
        == set(PERF_BACKENDS)


def test_instrumentation_imports_no_check(graph):
    # Instrumentation turns framework activity into events and knows nothing of checks.
    _, imports = graph
    bad = [_where(i) for i in imports if i.source.startswith("instrument") and i.target.startswith("checks")]
    assert not bad, bad


# Modules that import nndoctor modules named in strings (invisible to the graph above), and why.
STRING_IMPORTERS = {
    "cli": "each subcommand's module is imported only when that subcommand runs (no torch for `data`)",
    "commands.ckpt.cli": "the ckpt actions, imported when `nndoctor ckpt` builds its parser",
    "core.registry": "CHECK_MODULES, the check families loaded for the catalog",
    "commands.fix.codemods": "CODEMODS, one module per code, imported when a finding of that code is fixed",
    "catalog.entries": "the generated table names the module of each check (read with ast, not imported)",
    "catalog.update": "imports every family to regenerate the table",
    # Named, not imported in this process:
    "commands.perf.rerun": "runs `python -m nndoctor.commands.perf.torch.rerun_child` in a subprocess",
    "commands.perf.torch.rerun_child": "its argparse prog name",
    "commands.perf.tf.trials": "runs `python -m nndoctor.commands.perf.tf.rerun_child` in a subprocess",
    "commands.perf.tf.rerun_child": "its argparse prog name",
    "report.html": "reads the report's assets with importlib.resources",
    "commands.explain.base": "EXPLANATION_FAMILIES, the families `nndoctor explain` loads (not the runtime checks: no torch)",
    "commands.perf.warm_launcher": "WARM_CHILDREN, the re-run child its helper process imports and forks",
}


def string_imports(src: Path = SRC) -> list[tuple[str, str, int]]:
    """(module, named module, line) for every string constant naming an nndoctor module that is
    not a docstring (``importlib.import_module("nndoctor.x")`` or a table of such names)."""
    modules = find_modules(src)
    found = []
    for name, (path, _) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {
            id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                    and node.value.startswith("nndoctor.") and _short(node.value) in modules
                    and _short(node.value)):
                found.append((name, _short(node.value), node.lineno))
    return found


def test_modules_are_imported_by_name_only_where_listed():
    found = string_imports()
    # The reader works: the registry names the check families.
    assert ("core.registry", "checks", _line_of("core/registry.py", '    "nndoctor.checks",')) in found
    unexpected = sorted({f"nndoctor.{src}:{line} names nndoctor.{target}" for src, target, line in found
                         if src not in STRING_IMPORTERS})
    assert not unexpected, "import these explicitly: " + "; ".join(unexpected)


def summary(src: Path = SRC) -> str:
    modules, imports = import_graph(src)
    lines = [f"{len(modules)} modules, {len(imports)} imports"]
    for label, kinds in (("module-level", {"module"}), ("runtime (module + function)", RUNTIME),
                         ("all (with TYPE_CHECKING)", RUNTIME | {"typing"})):
        found = circles(modules, imports, kinds)
        lines.append(f"circles, {label}: {len(found)} {found}")
    for kind in ("module", "function", "typing"):
        found = upward(imports, {kind})
        lines.append(f"upward {kind} imports: {len(found)}")
        lines.extend(f"  {_where(imp)}" for imp in found)
    named = string_imports(src)
    lines.append(f"modules named in strings: {len(named)} in {sorted({m for m, _, _ in named})}")
    return "\n".join(lines)


# --- Package-level rules (issue 34; written by tools/relayout.py) ---
# Each top-level entry of src/nndoctor is one package in one layer; a package's modules default to
# its layer (LAYERS above names the exceptions, e.g. the data types in core are foundation).
PACKAGE_LAYERS: dict[str, int] = {
    "util": FOUNDATION,
    "core": ENGINE, "catalog": ENGINE,
    "instrument": FEATURES, "keras": FEATURES, "tfdata": FEATURES, "checks": FEATURES,
    "report": FEATURES, "run": FEATURES, "commands": FEATURES,
    "integrations": ENTRY, "cli": ENTRY, "__main__": ENTRY, "": ENTRY,
}
# The packages made for the layout: their __init__ is a docstring (importing one module of a
# package imports none of the others), so it sits in the foundation layer; so does, by default, a
# module of theirs that LAYERS does not name (the strictest layer: an upward import fails loudly).
DOCSTRING_PACKAGES = ("util", "core", "core.rules", "catalog", "run", "integrations", "commands")
for _package in DOCSTRING_PACKAGES:
    LAYERS.setdefault(_package, FOUNDATION)
STRING_IMPORTERS.setdefault(
    "", "the alias table: the old public paths of lightning, transformers, pytest_plugin (imported lazily)")

MAX_TOP_LEVEL = 15


def test_layout_packages_import_nothing(graph):
    _, imports = graph
    bad = [_where(i) for i in imports if i.source in DOCSTRING_PACKAGES]
    assert not bad, bad


def _package_of(module: str) -> str:
    return module.split(".")[0]


def test_top_level_has_few_entries():
    entries = sorted(e.name for e in (SRC / "nndoctor").iterdir() if e.name != "__pycache__")
    assert len(entries) <= MAX_TOP_LEVEL, f"{len(entries)} entries in src/nndoctor: {entries}"
    packages = {e.removesuffix(".py") for e in entries if e != "py.typed"} - {"__init__"}
    assert packages <= set(PACKAGE_LAYERS), f"give these a layer in PACKAGE_LAYERS: {packages - set(PACKAGE_LAYERS)}"


def test_no_package_imports_a_higher_one(graph):
    # A package's command-line front end (an entry-point module in LAYERS: perf.cli, catalog.cli,
    # run.cli, ...) may import any package; every other module only packages of its package's
    # layer or below.
    _, imports = graph
    bad = []
    for imp in imports:
        source, target = _package_of(imp.source), _package_of(imp.target)
        if source == target or layer_of(imp.source) == ENTRY:
            continue
        if PACKAGE_LAYERS[target] > PACKAGE_LAYERS[source]:
            bad.append(f"{_where(imp)}: package {source or '__init__'} ({LAYER_NAMES[PACKAGE_LAYERS[source]]}) "
                       f"imports package {target} ({LAYER_NAMES[PACKAGE_LAYERS[target]]})")
    assert not bad, "\n".join(bad)


def test_foundation_modules_import_no_package(graph):
    # util is the bottom: its modules import each other and the standard library, nothing else.
    _, imports = graph
    assert any(i.source == "util.atomic" and i.target == "util.errors" for i in imports)  # the reader sees util
    bad = [_where(i) for i in imports if _package_of(i.source) == "util" and _package_of(i.target) != "util"]
    assert not bad, bad
    # The foundation modules of the other packages (core's data types, the catalog's table) import
    # foundation modules only, never a package of a higher layer (nor its __init__).
    bad = [_where(i) for i in imports if layer_of(i.source) == FOUNDATION and layer_of(i.target) != FOUNDATION]
    assert not bad, bad


if __name__ == "__main__":
    print(summary(Path(sys.argv[1]) if len(sys.argv) > 1 else SRC))
