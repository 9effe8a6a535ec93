"""Move nndoctor's flat top-level modules into packages that show the architecture (issue 34).

Re-runnable and idempotent: run it on any tree (a merge of other branches included) from the
repository root, ``python tools/relayout.py`` (``--dry-run`` prints the plan and changes nothing).
A second run finds nothing to move and nothing to rewrite. It needs only the standard library,
``libcst`` (``from nndoctor import x`` statements) and, when installed, ``ruff`` (re-sorts the
imports it rewrote; without it, run ``ruff check --select I --fix src tests benchmarks``).

The layout (the top level holds 15 entries, each package one layer of the import rules):

=================  ==========  =========================================================================
entry              layer       what it holds
=================  ==========  =========================================================================
``util/``          foundation  helpers that import nothing else of nndoctor: atomic writes, limits,
                               sanitising text, errors, protobuf wire format, DTensor shards
``core/``          engine      the data every part builds on (findings, events, stash, subscribers,
                               suppression, "is this the user's code?") and the engine (session,
                               registry, selection, configuration); ``core/rules/``: pure rules
                               shared by the PyTorch and the Keras checks (no framework imported)
``catalog/``       engine      the catalog as data (table, generated entries) and its commands
``instrument/``    features    PyTorch instrumentation: framework activity -> events
``keras/``         features    Keras 3 / TensorFlow instrumentation and checks
``tfdata/``        features    tf.data pipeline instrumentation and checks
``checks/``        features    the PyTorch checks: events -> findings
``report/``        features    findings -> terminal, JSON, SARIF, HTML, TensorBoard
``run/``           features    ``nndoctor run``'s machinery: runner, its CLI, guards, signals,
                               streams, watchdog, crash context, history, the per-rank runs of
                               ``torchrun`` (``run/distributed/``), start-up
``commands/``      features    every other command's machinery: explain, data, ckpt, env,
                               preflight, fix, perf, demo
``integrations/``  entry       nndoctor inside other tools: ``watch()`` (api), Lightning, 🤗,
                               pytest, notebooks
``cli.py``         entry       the ``nndoctor`` command: one subcommand per package
``__init__.py``    entry       the public API; serves the old public import paths (below)
``__main__.py``    entry       ``python -m nndoctor``
``py.typed``
=================  ==========  =========================================================================

Why this grouping: a reader sees the pipeline (``instrument``/``keras``/``tfdata`` produce
events, ``checks`` turn them into findings, ``report`` shows them, all on ``core``), then the
machinery of ``nndoctor run`` (``run/``), of every other command (``commands/``), and the ways
in from other tools (``integrations/``). Existing subpackages move only where the 15-entry budget
needs it: ``distributed`` (the multi-rank side of ``run``) and the seven other commands.

Old public import paths keep working without files at the top level: ``nndoctor/__init__.py``
gets a lazy ``importlib.abc.MetaPathFinder`` (``PUBLIC_ALIASES``) that serves
``nndoctor.lightning``, ``nndoctor.transformers`` and ``nndoctor.pytest_plugin`` (the pytest11
entry point of installs made before the move) from their new modules, importing nothing until
one is asked for. Markdown keeps naming those public paths; code and tests use the new ones.

What it rewrites, in tracked text files of src/, tests/, benchmarks/, docs/, .ci/, README.md,
CONTRIBUTING.md and pyproject.toml:

* dotted names ``nndoctor.<old>[.<rest>]`` anywhere (imports, ``import nndoctor.x``, strings
  given to ``monkeypatch.setattr``, ``mock.patch``, ``importlib.import_module``, ``-m``
  arguments, the pytest11 entry point, mypy's module lists);
* ``from nndoctor import <old> [as y]`` (libcst; names of ``nndoctor/__init__`` such as
  ``watch`` or ``Finding`` are left alone);
* source paths: ``src/nndoctor/<old>...`` and ``nndoctor/<old>[/...].py``
  (not ``nndoctor/findings/<CODE>``: TensorBoard tags are not paths);
* pyproject's package-data globs of moved packages;
* tests/test_layering.py: the short module names of its tables (``"runner"`` ->
  ``"run.runner"``), the file names given to ``_line_of``, and the package-level rules block.

What it cannot do (printed at the end when found): relative imports inside a moved module
(none today), a bare file name in prose (``see runner.py``), and top-level modules it has no
mapping for (a module a merged branch added: add it to ``MODULES`` and run again).
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

# Old top-level name (module or subpackage, under src/nndoctor) -> new dotted name.
MODULES: dict[str, str] = {
    # util/: helpers importing nothing else of nndoctor
    "atomic": "util.atomic",
    "errors": "util.errors",
    "limits": "util.limits",
    "sanitize": "util.sanitize",
    "protowire": "util.protowire",
    "dtensor": "util.dtensor",
    # core/: foundation data types and the engine
    "_version": "core._version",
    "findings": "core.findings",
    "events": "core.events",
    "stash": "core.stash",
    "subscribers": "core.subscribers",
    "suppression": "core.suppression",
    "probes": "core.probes",
    "optimizers": "core.optimizers",
    "user_code": "core.user_code",
    "tracebacks": "core.tracebacks",
    "engine": "core.engine",
    "registry": "core.registry",
    "selection": "core.selection",
    "config": "core.config",
    # core/rules/: pure rules shared by the PyTorch and Keras checks
    "chance_level": "core.rules.chance_level",
    "image_batches": "core.rules.image_batches",
    "initial_loss": "core.rules.initial_loss",
    "loss_trend": "core.rules.loss_trend",
    "dead_units": "core.rules.dead_units",  # s28-kprobes
    "gradient_explosion": "core.rules.gradient_explosion",  # s28-kprobes
    # catalog/
    "catalog_cli": "catalog.cli",
    "catalog_entries": "catalog.entries",
    "catalog_table": "catalog.table",
    "catalog_update": "catalog.update",
    # run/: nndoctor run's machinery
    "runner": "run.runner",
    "runner_cli": "run.cli",
    "run_end": "run.end",
    "run_guards": "run.guards",
    "signals": "run.signals",
    "streams": "run.streams",
    "watchdog": "run.watchdog",
    "crash_context": "run.crash_context",
    "history": "run.history",
    "_startup": "run._startup",
    "distributed": "run.distributed",
    # integrations/
    "api": "integrations.api",
    "integration": "integrations.base",
    "lightning": "integrations.lightning",
    "transformers": "integrations.transformers",
    "pytest_plugin": "integrations.pytest_plugin",
    "notebook": "integrations.notebook",
    # commands/: every other command's machinery
    "explain": "commands.explain",
    "data": "commands.data",
    "ckpt": "commands.ckpt",
    "env": "commands.env",
    "preflight": "commands.preflight",
    "fix": "commands.fix",
    "perf": "commands.perf",
    "demo": "commands.demo",
}

# Entries that stay at the top level (anything else found there is reported as unmapped).
STAYS = {"__init__.py", "__main__.py", "py.typed", "cli.py", "instrument", "checks", "report",
         "keras", "tfdata", "__pycache__"}

# Old public import paths served by nndoctor/__init__.py (documented to users; Markdown keeps them).
PUBLIC_ALIASES = {
    "lightning": "integrations.lightning",
    "transformers": "integrations.transformers",
    "pytest_plugin": "integrations.pytest_plugin",
}

# New packages' __init__.py (docstring only: importing one module of a package must not import
# the others, and nndoctor/__init__ imports run._startup first of all).
PACKAGE_DOCS = {
    "util": "Helpers that import nothing else of nndoctor: atomic writes, size limits, sanitised\n"
            "text, nndoctor's errors, the protobuf wire format, DTensor shards.",
    "core": "What every part builds on: the data (findings, events, the stash, subscribers,\n"
            "suppression, \"is this the user's code?\") and the engine (session, check registry,\n"
            "code selection, configuration).",
    "core.rules": "Pure rules shared by the PyTorch and the Keras checks (chance level, image batches,\n"
                  "initial loss, loss trend): numbers in, verdicts out, no framework imported.",
    "catalog": "The catalog of codes: the table as data (``table``, the generated ``entries``), and the\n"
               "``nndoctor checks`` command (``cli``) and its generator (``update``).",
    "run": "``nndoctor run``'s machinery: the runner and its CLI, guards, signals, captured streams,\n"
           "the watchdog, crash context, history, the per-rank runs under ``torchrun``\n"
           "(``distributed``) and the start-up step of ``python -m nndoctor``.",
    "integrations": "nndoctor inside other tools: ``watch()`` (``api``), Lightning and 🤗 callbacks, the\n"
                    "pytest plugin, notebooks (``base`` holds what the callbacks share).\n\n"
                    "``nndoctor.lightning``, ``nndoctor.transformers`` and ``nndoctor.pytest_plugin``\n"
                    "stay importable: ``nndoctor/__init__`` serves them from here.",
    "commands": "Every command's machinery but ``run``'s: explain, data, ckpt, env, preflight, fix,\n"
                "perf, demo (each package's ``cli`` is its front end).",
}

# Files that name the old public paths on purpose (the alias table, its test): as in Markdown,
# `nndoctor.lightning` & co. stay there.
KEEP_PUBLIC_NAMES = {"src/nndoctor/__init__.py", "tests/integrations/test_public_import_paths.py"}

ROOTS = ["src", "tests", "benchmarks", "docs", ".ci", "README.md", "CONTRIBUTING.md", "pyproject.toml"]
TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".cfg", ".ini", ".yaml", ".yml", ".json", ".sh",
                 ".ipynb", ".rst", ".pyi", ""}

ALIAS_MARK = "# Old public import paths (issue 34)"
LAYERING_MARK = "# --- Package-level rules (issue 34; written by tools/relayout.py) ---"


def sh(*args: str, check: bool = True) -> str:
    return subprocess.run(args, check=check, capture_output=True, text=True).stdout


class Relayout:
    def __init__(self, root: Path, dry_run: bool) -> None:
        self.root, self.dry_run = root, dry_run
        self.pkg = root / "src" / "nndoctor"
        self.log: list[str] = []
        self.warnings: list[str] = []
        self.changed_py: list[Path] = []

    def say(self, line: str) -> None:
        print(line)
        self.log.append(line)

    def warn(self, line: str) -> None:
        print("WARNING: " + line)
        self.warnings.append(line)

    # ---- moving files -------------------------------------------------------------------------

    def _old_path(self, old: str) -> Path:
        directory = self.pkg / old
        return directory if directory.is_dir() else self.pkg / f"{old}.py"

    def _new_path(self, old: str, new: str) -> Path:
        parts = new.split(".")
        return (self.pkg.joinpath(*parts) if (self.pkg / old).is_dir() or self.pkg.joinpath(*parts).is_dir()
                else self.pkg.joinpath(*parts[:-1], parts[-1] + ".py"))

    def create_packages(self) -> None:
        for package, doc in PACKAGE_DOCS.items():
            init = self.pkg.joinpath(*package.split("."), "__init__.py")
            if init.exists():
                continue
            self.say(f"create {init.relative_to(self.root)}")
            if not self.dry_run:
                init.parent.mkdir(parents=True, exist_ok=True)
                init.write_text(f'"""{doc}"""\n', encoding="utf-8")
                sh("git", "-C", str(self.root), "add", str(init))

    def move(self) -> None:
        for old, new in MODULES.items():
            source = self._old_path(old)
            target = self._new_path(old, new)
            if source.exists() and target.exists():
                self.warn(f"both {source.relative_to(self.root)} and {target.relative_to(self.root)} exist: merge them by hand")
            elif source.exists():
                self.say(f"git mv {source.relative_to(self.root)} {target.relative_to(self.root)}")
                if not self.dry_run:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    sh("git", "-C", str(self.root), "mv", str(source), str(target))
                    if source.is_dir():  # untracked leftovers (__pycache__) keep the old folder alive
                        shutil.rmtree(source)
                    self.fix_depth(target, deeper_by=len(new.split(".")) - 1)
            elif not target.exists():
                print(f"skip nndoctor.{old}: not on this tree")
        for entry in sorted(self.pkg.iterdir()):
            if entry.name not in STAYS and entry.name not in {n.split(".")[0] for n in MODULES.values()} \
                    and entry.name.removesuffix(".py") not in MODULES:
                self.warn(f"unmapped top-level entry src/nndoctor/{entry.name}: add it to MODULES")

    def fix_depth(self, unit: Path, deeper_by: int) -> None:
        """``os.path.dirname(...(__file__))`` chains that climb to nndoctor's folder or above
        climb ``deeper_by`` more levels after the move (run once, when the file moves: never twice)."""
        files = sorted(unit.rglob("*.py")) if unit.is_dir() else [unit]
        for path in files:
            inside = len(path.relative_to(unit).parts) if unit.is_dir() else 0  # levels that move along
            text = path.read_text(encoding="utf-8")
            new = text
            for climbs in range(6, 0, -1):
                pattern = re.compile(r"(?<!os\.path\.dirname\()" + r"os\.path\.dirname\(" * climbs
                                     + r"(os\.path\.(?:abspath|realpath)\(__file__\)|__file__)" + r"\)" * climbs)
                if climbs > inside:
                    new = pattern.sub(lambda m, c=climbs: "os.path.dirname(" * (c + deeper_by) + m.group(1)
                                      + ")" * (c + deeper_by), new)
            if new != text:
                self.say(f"climb {deeper_by} more folder(s) to nndoctor's own folder in {path.relative_to(self.root)}")
                path.write_text(new, encoding="utf-8")
                self.changed_py.append(path)
            lines = new.splitlines()
            file_lines = {node.lineno for node in ast.walk(ast.parse(new))
                          if isinstance(node, ast.Name) and node.id == "__file__"}
            if any(".parent" in lines[n - 1] for n in file_lines):
                self.warn(f"{path.relative_to(self.root)}: Path(__file__).parent... may need one more level")

    # ---- rewriting references ------------------------------------------------------------------

    def files(self) -> list[Path]:
        listed = sh("git", "-C", str(self.root), "ls-files", "--", *ROOTS).splitlines()
        found = []
        for name in listed:
            path = self.root / name
            if path.is_file() and (path.suffix in TEXT_SUFFIXES or name.startswith(".ci/")):
                found.append(path)
        return found

    @staticmethod
    def dotted_pattern(names: list[str]) -> re.Pattern[str]:
        alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
        # Not before "(": `nndoctor.findings(at="info")` is the pytest fixture's method, and a
        # module is never called.
        return re.compile(rf"(?<![\w.])nndoctor\.({alternatives})(?![\w(])")

    def path_patterns(self) -> list[tuple[re.Pattern[str], str]]:
        patterns = []
        for old, new in sorted(MODULES.items(), key=lambda item: len(item[0]), reverse=True):
            new_path = new.replace(".", "/")
            is_package = self.pkg.joinpath(*new.split(".")).is_dir() or (self.pkg / old).is_dir()
            if is_package:
                # src/nndoctor/perf..., or nndoctor/perf/<file>.py
                patterns.append((re.compile(rf"(?<![\w./-])src/nndoctor/{re.escape(old)}(?![\w])"),
                                 f"src/nndoctor/{new_path}"))
                patterns.append((re.compile(rf"(?<![\w./-])nndoctor/{re.escape(old)}/(?=[\w./<>*-]*\.py\b)"),
                                 f"nndoctor/{new_path}/"))
            else:
                patterns.append((re.compile(rf"(?<![\w./-])((?:src/)?)nndoctor/{re.escape(old)}\.py\b"),
                                 rf"\1nndoctor/{new_path}.py"))
        return patterns

    def rewrite_text(self) -> None:
        code_pattern = self.dotted_pattern(list(MODULES))
        prose_pattern = self.dotted_pattern([n for n in MODULES if n not in PUBLIC_ALIASES])
        paths = self.path_patterns()
        for path in self.files():
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            new = text
            if path.suffix == ".py":
                new = self.rewrite_from_imports(path, new)
            keeps_public_names = (path.suffix in {".md", ".rst"}
                                  or path.relative_to(self.root).as_posix() in KEEP_PUBLIC_NAMES)
            pattern = prose_pattern if keeps_public_names else code_pattern
            new = pattern.sub(lambda m: "nndoctor." + MODULES[m.group(1)], new)
            for regex, replacement in paths:
                new = regex.sub(replacement, new)
            new = self.rewrite_file_names(new)
            if path.name == "pyproject.toml" and path.parent == self.root:
                new = self.rewrite_package_data(new)
            if path.relative_to(self.root).as_posix() == "tests/test_layering.py":
                new = self.rewrite_layering(new)
            if path.relative_to(self.root).as_posix().startswith("src/nndoctor/") and "from ." in new:
                if re.search(r"^\s*from \.+\w* import", new, re.M):
                    self.warn(f"{path.relative_to(self.root)}: relative imports are not rewritten")
            if new != text:
                count = sum(1 for a, b in zip(text.splitlines(), new.splitlines(), strict=False) if a != b)
                self.say(f"rewrite {path.relative_to(self.root)} ({count} line(s))")
                if not self.dry_run:
                    path.write_text(new, encoding="utf-8")
                if path.suffix == ".py":
                    self.changed_py.append(path)

    def rewrite_from_imports(self, path: Path, text: str) -> str:
        """``from nndoctor import runner, Finding`` -> ``from nndoctor import Finding`` +
        ``from nndoctor.run import runner`` (names of nndoctor/__init__ stay)."""
        if not re.search(r"from\s+nndoctor\s+import", text):
            return text
        import libcst as cst

        try:
            tree = cst.parse_module(text)
        except cst.ParserSyntaxError:
            self.warn(f"{path.relative_to(self.root)}: not parseable, `from nndoctor import` left as is")
            return text

        class Transformer(cst.CSTTransformer):
            def leave_SimpleStatementLine(self, original, updated):  # type: ignore[no-untyped-def]
                if len(updated.body) != 1 or not isinstance(updated.body[0], cst.ImportFrom):
                    return updated
                node = updated.body[0]
                if node.relative or node.module is None or cst.Module([]).code_for_node(node.module) != "nndoctor" \
                        or isinstance(node.names, cst.ImportStar):
                    return updated
                kept, moved = [], []
                for alias in node.names:
                    name = cst.Module([]).code_for_node(alias.name)
                    if name in MODULES:
                        bound = alias.asname.name.value if alias.asname else name  # type: ignore[union-attr]
                        moved.append((MODULES[name], bound))
                    else:
                        kept.append(alias)
                if not moved:
                    return updated
                lines = []
                if kept:
                    kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
                    lines.append(node.with_changes(names=kept, lpar=cst.MaybeSentinel.DEFAULT
                                                   if len(kept) == 1 else node.lpar,
                                                   rpar=cst.MaybeSentinel.DEFAULT if len(kept) == 1 else node.rpar))
                for new, bound in moved:
                    parent, _, leaf = ("nndoctor." + new).rpartition(".")
                    suffix = "" if leaf == bound else f" as {bound}"
                    lines.append(cst.parse_statement(f"from {parent} import {leaf}{suffix}\n").body[0])
                statements = [cst.SimpleStatementLine(body=[stmt]) for stmt in lines]
                statements[0] = statements[0].with_changes(leading_lines=updated.leading_lines)
                comment = updated.trailing_whitespace.comment
                keep_on_each = comment is not None and "noqa" in comment.value  # each line needs it
                for index, statement in enumerate(statements):
                    if keep_on_each or index == len(statements) - 1:
                        statements[index] = statement.with_changes(trailing_whitespace=updated.trailing_whitespace)
                return cst.FlattenSentinel(statements)

        return tree.visit(Transformer()).code

    @staticmethod
    def rewrite_file_names(text: str) -> str:
        """Renamed modules' file names: ``with_name("catalog_entries.py")`` (a sibling: the leaf)
        and the bare name in prose (``catalog_entries.py`` -> ``catalog/entries.py``)."""
        for old, new in MODULES.items():
            # os.path.join(NNDOCTOR_DIR, "demo") -> os.path.join(NNDOCTOR_DIR, "commands", "demo")
            pieces = ", ".join(f'"{part}"' for part in new.split("."))
            text = re.sub(rf"(os\.path\.join\(\s*[\w.]*NNDOCTOR\w*\s*,\s*)([\"']){re.escape(old)}\2(?=\s*[,)])",
                          lambda m, p=pieces: m.group(1) + p, text)
            leaf = new.rpartition(".")[2]
            if leaf == old:
                continue
            text = re.sub(rf"(with_name\(\s*)([\"']){re.escape(old)}\.py\2", rf"\1\2{leaf}.py\2", text)
            text = re.sub(rf"(?<![\w/.-]){re.escape(old)}\.py\b", new.replace(".", "/") + ".py", text)
        return text

    @staticmethod
    def rewrite_package_data(text: str) -> str:
        def fix(match: re.Match[str]) -> str:
            line = match.group(0)
            for old, new in MODULES.items():
                line = re.sub(rf'(?<=["\']){re.escape(old)}/', new.replace(".", "/") + "/", line)
            return line

        return re.sub(r"(?m)^nndoctor = \[.*\]$", fix, text)

    def rewrite_layering(self, text: str) -> str:
        """Short module names in tests/test_layering.py's tables, and its package-level rules."""

        def short(match: re.Match[str]) -> str:
            quote, value = match.group(1), match.group(2)
            head = value.split(".")[0]
            if value.endswith(".py") and "/" not in value and value[:-3] in MODULES:
                return f"{quote}{MODULES[value[:-3]].replace('.', '/')}.py{quote}"
            if head in MODULES and "/" not in value and " " not in value:
                return f"{quote}{MODULES[head]}{value[len(head):]}{quote}"
            return match.group(0)

        # Only the code after the module docstring: the docstring's prose names layers, not modules.
        doc_end = text.index('"""', text.index('"""') + 3) + 3
        # LAYER_NAMES holds the layers' names ("engine" is a layer there, not the module).
        body = "".join(line if line.startswith("LAYER_NAMES") else re.sub(r"(?<![\w])([\"'])([\w.]+)\1", short, line)
                       for line in text[doc_end:].splitlines(keepends=True))
        text = text[:doc_end] + body
        if LAYERING_MARK not in text:
            anchor = '\nif __name__ == "__main__":'
            text = text.replace(anchor, "\n" + LAYERING_BLOCK + anchor, 1)
        return text

    # ---- the public aliases ---------------------------------------------------------------------

    def add_aliases(self) -> None:
        init = self.pkg / "__init__.py"
        text = init.read_text(encoding="utf-8")
        if ALIAS_MARK in text:
            return
        anchor = "from typing import TYPE_CHECKING, Any\n"
        if anchor not in text:
            self.warn("src/nndoctor/__init__.py: no `from typing import TYPE_CHECKING, Any` line; add the aliases by hand")
            return
        self.say("add the old public import paths to src/nndoctor/__init__.py")
        text = text.replace(anchor, ALIAS_IMPORTS + anchor, 1)
        if not self.dry_run:
            init.write_text(text.rstrip("\n") + "\n\n\n" + ALIAS_BLOCK, encoding="utf-8")
        self.changed_py.append(init)

    def add_alias_test(self) -> None:
        test = self.root / "tests" / "integrations" / "test_public_import_paths.py"
        if test.exists():
            return
        self.say(f"create {test.relative_to(self.root)}")
        if not self.dry_run:
            test.write_text(ALIAS_TEST, encoding="utf-8")
            sh("git", "-C", str(self.root), "add", str(test))
        self.changed_py.append(test)

    def sort_imports(self) -> None:
        files = sorted({str(p) for p in self.changed_py if p.exists()
                        and not p.relative_to(self.root).as_posix().startswith(("tests/fixtures/",
                                                                                "tests/frameworks/programs/"))})
        if not files or self.dry_run:
            return
        if shutil.which("ruff") is None:
            self.warn("ruff is not installed: run `ruff check --select I --fix src tests benchmarks`")
            return
        subprocess.run(["ruff", "check", "--quiet", "--select", "I", "--fix", *files], cwd=self.root, check=False)
        self.say(f"ruff --select I --fix on {len(files)} rewritten file(s)")

    def run(self) -> int:
        self.create_packages()
        self.move()
        self.add_aliases()
        self.rewrite_text()
        self.add_alias_test()
        self.sort_imports()
        entries = sorted(e.name for e in self.pkg.iterdir() if e.name != "__pycache__")
        print(f"\nsrc/nndoctor: {len(entries)} entries: {' '.join(entries)}")
        if not self.log:
            print("nothing to do: the tree is already laid out")
        for line in self.warnings:
            print("WARNING: " + line)
        return 1 if self.warnings else 0


ALIAS_IMPORTS = "import importlib\nimport importlib.abc\nimport importlib.machinery\nimport sys\nfrom types import ModuleType\n"

ALIAS_BLOCK = f'''{ALIAS_MARK}: modules that moved into nndoctor.integrations stay
# importable under the names users and older installs know (`from nndoctor.lightning import
# DoctorCallback`, the pytest11 entry point `nndoctor.pytest_plugin`). The finder imports the new
# module only when an old name is imported; `import nndoctor` imports none of them.
_PUBLIC_ALIASES = {{
{chr(10).join(f'    "nndoctor.{old}": "nndoctor.{new}",' for old, new in PUBLIC_ALIASES.items())}
}}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        # The module itself, not a copy: both names share its objects (isinstance, monkeypatch).
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        pass  # already executed under its own name


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _PUBLIC_ALIASES:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(_PUBLIC_ALIASES[fullname]))


if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
    sys.meta_path.append(_AliasFinder())
'''

LAYERING_BLOCK = f'''{LAYERING_MARK}
# Each top-level entry of src/nndoctor is one package in one layer; a package's modules default to
# its layer (LAYERS above names the exceptions, e.g. the data types in core are foundation).
PACKAGE_LAYERS: dict[str, int] = {{
    "util": FOUNDATION,
    "core": ENGINE, "catalog": ENGINE,
    "instrument": FEATURES, "keras": FEATURES, "tfdata": FEATURES, "checks": FEATURES,
    "report": FEATURES, "run": FEATURES, "commands": FEATURES,
    "integrations": ENTRY, "cli": ENTRY, "__main__": ENTRY, "": ENTRY,
}}
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
    assert len(entries) <= MAX_TOP_LEVEL, f"{{len(entries)}} entries in src/nndoctor: {{entries}}"
    packages = {{e.removesuffix(".py") for e in entries if e != "py.typed"}} - {{"__init__"}}
    assert packages <= set(PACKAGE_LAYERS), f"give these a layer in PACKAGE_LAYERS: {{packages - set(PACKAGE_LAYERS)}}"


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
            bad.append(f"{{_where(imp)}}: package {{source or '__init__'}} ({{LAYER_NAMES[PACKAGE_LAYERS[source]]}}) "
                       f"imports package {{target}} ({{LAYER_NAMES[PACKAGE_LAYERS[target]]}})")
    assert not bad, "\\n".join(bad)


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

'''

ALIAS_TEST = '''"""The public import paths from before the packages (issue 34) still work, lazily."""

from __future__ import annotations

import importlib
import subprocess
import sys
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("old", "new"), [
    ("nndoctor.pytest_plugin", "nndoctor.integrations.pytest_plugin"),
    ("nndoctor.lightning", "nndoctor.integrations.lightning"),
    ("nndoctor.transformers", "nndoctor.integrations.transformers"),
])
def test_old_path_is_the_new_module(old, new):
    framework = new.rpartition(".")[2]
    if framework != "pytest_plugin":
        pytest.importorskip(framework)
    assert importlib.import_module(old) is importlib.import_module(new)


def test_old_from_import_gives_the_same_class():
    pytest.importorskip("lightning")
    from nndoctor.integrations.lightning import DoctorCallback as new
    from nndoctor.lightning import DoctorCallback as old

    assert old is new


def test_unknown_names_are_still_missing():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("nndoctor.no_such_module")


def test_pytest_entry_point_names_the_new_module():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'nndoctor = "nndoctor.integrations.pytest_plugin"' in pyproject.split("[project.entry-points.pytest11]")[1]
    assert 'nndoctor = "nndoctor.cli:main"' in pyproject.split("[project.scripts]")[1]


def test_import_nndoctor_imports_no_integration():
    code = ("import sys, nndoctor; print(sorted(m for m in sys.modules if m.startswith('nndoctor.integrations')"
            " or m in ('lightning', 'transformers', 'torch')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "src")}).stdout
    assert out.strip() == "[]"
'''


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args()
    return Relayout(args.root.resolve(), args.dry_run).run()


if __name__ == "__main__":
    sys.exit(main())
