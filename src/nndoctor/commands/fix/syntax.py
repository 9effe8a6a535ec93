"""The codemods' shared view of a source file: libcst nodes by line, scopes, and edits.

A codemod gets a :class:`FixContext` (the parsed file, the finding's line) and returns the new
source text, or raises :class:`Uncertain` with the reason it will not guess. libcst keeps every
comment and blank line the edit does not touch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from nndoctor.core.findings import Finding
from nndoctor.util.errors import UsageError


def load_libcst() -> Any:
    """libcst, imported only when ``nndoctor fix`` runs (the ``fix`` extra)."""
    try:
        import libcst
        import libcst.metadata  # noqa: F401 - the metadata providers are a submodule
    except ImportError:
        raise UsageError("nndoctor fix needs libcst: pip install 'nndoctor[fix]' (or pip install libcst)") from None
    return libcst


class Uncertain(Exception):
    """The codemod sees more than one plausible edit, or none it can justify: say why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def dotted(node: Any) -> str | None:
    """``torch.optim.Adam`` for a Name/Attribute chain, else None."""
    cst = load_libcst()
    if isinstance(node, cst.Name):
        return str(node.value)
    if isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr.value}" if base is not None else None
    return None


def call_name(node: Any) -> str | None:
    """The dotted name a Call calls (``F.cross_entropy``), else None."""
    cst = load_libcst()
    return dotted(node.func) if isinstance(node, cst.Call) else None


def keyword(call: Any, name: str) -> Any:
    """The ``name=`` argument of ``call``, or None."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg
    return None


class FixContext:
    """One source file parsed once, with positions and parents, for codemods to query."""

    def __init__(self, source: str, line: int, finding: Finding | None = None, path: str = "") -> None:
        cst = load_libcst()
        self.cst = cst
        self.source = source
        self.line = line
        self.finding = finding
        self.path = path
        wrapper = cst.metadata.MetadataWrapper(cst.parse_module(source))
        self.module = wrapper.module
        self._positions = wrapper.resolve(cst.metadata.PositionProvider)
        self._parents = wrapper.resolve(cst.metadata.ParentNodeProvider)

    # -- where things are ------------------------------------------------------------------
    def start(self, node: Any) -> int:
        return int(self._positions[node].start.line)

    def end(self, node: Any) -> int:
        return int(self._positions[node].end.line)

    def parent(self, node: Any) -> Any | None:
        return self._parents.get(node)

    def ancestors(self, node: Any) -> Iterator[Any]:
        node = self.parent(node)
        while node is not None:
            yield node
            node = self.parent(node)

    def walk(self, root: Any | None = None) -> Iterator[Any]:
        """Every node under ``root`` (default: the module), parents before children."""
        stack = [root if root is not None else self.module]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))

    def nodes(self, kind: Any, root: Any | None = None) -> list[Any]:
        return [n for n in self.walk(root) if isinstance(n, kind) and n in self._positions]

    def statement_at(self, line: int | None = None) -> Any:
        """The innermost simple statement on ``line`` (or a compound statement's header line)."""
        line = self.line if line is None else line
        simple = [n for n in self.nodes(self.cst.SimpleStatementLine) if self.start(n) <= line <= self.end(n)]
        if simple:
            return max(simple, key=self.start)
        compound = [n for n in self.nodes(self.cst.BaseCompoundStatement) if self.start(n) == line]
        if compound:
            return compound[0]
        raise Uncertain(f"no statement found at line {line}")

    def enclosing(self, node: Any, kinds: Any) -> list[Any]:
        """Ancestors of ``node`` of ``kinds``, innermost first."""
        return [a for a in self.ancestors(node) if isinstance(a, kinds)]

    def loops(self, node: Any) -> list[Any]:
        return self.enclosing(node, (self.cst.For, self.cst.While))

    def scope_of(self, node: Any) -> Any:
        """The function (or the module) ``node`` is in: names are looked up there."""
        functions = self.enclosing(node, self.cst.FunctionDef)
        return functions[0] if functions else self.module

    def calls(self, root: Any | None = None) -> list[Any]:
        return self.nodes(self.cst.Call, root)

    def assignments(self, name: str, root: Any | None = None) -> list[Any]:
        """``Assign`` nodes whose single target is ``name``, in source order."""
        found = []
        for node in self.nodes(self.cst.Assign, root):
            targets = [t.target for t in node.targets]
            if len(targets) == 1 and isinstance(targets[0], self.cst.Name) and targets[0].value == name:
                found.append(node)
        return sorted(found, key=self.start)

    def assignment_before(self, name: str, line: int, root: Any | None = None) -> Any:
        """The last ``name = …`` at or before ``line``; Uncertain when there is none."""
        found = [a for a in self.assignments(name, root) if self.start(a) <= line]
        if not found:
            raise Uncertain(f"'{name}' is not assigned in this file before line {line}")
        return found[-1]

    def uses(self, name: str, root: Any | None = None) -> list[Any]:
        """Name nodes reading or writing ``name`` (attribute names excluded)."""
        result = []
        for node in self.nodes(self.cst.Name, root):
            parent = self.parent(node)
            if isinstance(parent, self.cst.Attribute) and parent.attr is node:
                continue
            if isinstance(parent, self.cst.Arg) and parent.keyword is node:
                continue
            if node.value == name:
                result.append(node)
        return result

    def statement_of(self, node: Any) -> Any:
        """The statement (simple line or compound) that contains ``node``."""
        if isinstance(node, (self.cst.SimpleStatementLine, self.cst.BaseCompoundStatement)):
            return node
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, (self.cst.SimpleStatementLine, self.cst.BaseCompoundStatement)):
                return ancestor
        raise Uncertain("the expression is not inside a statement")

    def model_names(self) -> set[str]:
        """Names whose ``.parameters()`` go to an optimizer: the models being trained."""
        names = set()
        for call in self.calls():
            for arg in call.args:
                value = arg.value
                if (isinstance(value, self.cst.Call) and isinstance(value.func, self.cst.Attribute)
                        and value.func.attr.value in ("parameters", "named_parameters")):
                    owner = dotted(value.func.value)
                    if owner is not None:
                        names.add(owner)
        return names

    def optimizer_names(self, root: Any | None = None) -> set[str]:
        """Names ``X`` with ``X.step()`` under ``root`` that were built from parameters or torch.optim."""
        stepped = {dotted(c.func.value) for c in self.calls(root)
                   if isinstance(c.func, self.cst.Attribute) and c.func.attr.value == "step" and not c.args}
        result = set()
        for name in stepped:
            if name is None:
                continue
            for assign in self.assignments(name):
                called = call_name(assign.value) or ""
                text = self.module.code_for_node(assign.value)
                if "optim" in called or ".parameters()" in text:
                    result.add(name)
        return result

    # -- edits -----------------------------------------------------------------------------
    def code(self, node: Any) -> str:
        return str(self.module.code_for_node(node))

    def replace(self, old: Any, new: Any) -> str:
        """The file's text with node ``old`` replaced by ``new``."""
        return str(self.module.deep_replace(old, new).code)

    def _body_owner(self, statement: Any) -> tuple[Any, Sequence[Any]]:
        parent = self.parent(statement)
        if parent is None or not hasattr(parent, "body") or isinstance(parent.body, self.cst.BaseSuite):
            raise Uncertain("the statement is not in a block that can take another statement")
        return parent, parent.body

    def insert(self, statement: Any, new_statements: Sequence[str], *, after: bool = False,
               keep_comments: bool = False) -> str:
        """Insert source lines (``"model.eval()"``) before or after ``statement``, same indent.

        Inserted before it, the new lines go below the comments above ``statement`` (they
        introduce the block there), or above them with ``keep_comments`` (they describe it)."""
        owner, body = self._body_owner(statement)
        index = list(body).index(statement) + (1 if after else 0)
        parsed = [self.cst.parse_statement(text.rstrip("\n") + "\n") for text in new_statements]
        if not after and not keep_comments and index < len(body):
            # The comments and blank lines above the statement stay above the inserted lines.
            first = body[index]
            leading = getattr(first, "leading_lines", ())
            if leading and parsed:
                parsed[0] = parsed[0].with_changes(leading_lines=leading)
                body = [*body[:index], first.with_changes(leading_lines=()), *body[index + 1:]]
        new_body = [*body[:index], *parsed, *body[index:]]
        return str(self.module.deep_replace(owner, owner.with_changes(body=new_body)).code)

    def insert_at_block_start(self, compound: Any, new_statements: Sequence[str]) -> str:
        """Insert lines as the first statements of ``compound``'s indented body (a comment
        right under the header stays with the statement it describes, below the new lines)."""
        block = compound.body
        if not isinstance(block, self.cst.IndentedBlock) or not block.body:
            raise Uncertain("the block is written on one line; there is no place for a new first line")
        return self.insert(block.body[0], new_statements, keep_comments=True)


def with_keyword(call: Any, name: str, value_code: str) -> Any:
    """``call`` with ``name=value`` added as its last argument, keeping a trailing comma layout."""
    cst = load_libcst()
    value = cst.parse_expression(value_code)
    new_arg = cst.Arg(value=value, keyword=cst.Name(name),
                      equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                            whitespace_after=cst.SimpleWhitespace("")))
    args = list(call.args)
    if not args:
        return call.with_changes(args=[new_arg])
    last = args[-1]
    if isinstance(last.comma, cst.Comma):
        # A trailing comma (often before a newline) moves to the new last argument.
        previous = args[-2].comma if len(args) > 1 and isinstance(args[-2].comma, cst.Comma) else \
            cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        args[-1] = last.with_changes(comma=previous)
        new_arg = new_arg.with_changes(comma=last.comma)
    return call.with_changes(args=[*args, new_arg])


def without_last_element(call: Any) -> Any:
    """``call`` without its last positional argument (its comma layout kept)."""
    args = list(call.args)
    removed = args.pop()
    if args:
        args[-1] = args[-1].with_changes(comma=removed.comma)
    return call.with_changes(args=args)
