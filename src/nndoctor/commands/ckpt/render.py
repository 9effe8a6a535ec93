"""Terminal views of a checkpoint (key tree) and of a diff (mapping table).

Every name shown here comes from the file (keys, metadata, class names) or the command line, so
it goes through ``_safe``: rich markup escaped and control characters made visible, so that a key
named ``"\x1b]0;pwned\x07"`` cannot rewrite the terminal.
"""

from __future__ import annotations

from typing import IO, Any

from rich.console import Console
from rich.markup import escape as _markup_escape
from rich.tree import Tree

from nndoctor.commands.ckpt.checkpoint import Checkpoint, StateDict, TensorInfo
from nndoctor.commands.ckpt.mapping import KeyMapping
from nndoctor.report.terminal import no_color_options
from nndoctor.util.sanitize import printable

_OTHER_ENTRIES_SHOWN = 60


def escape(text: object) -> str:
    """Untrusted text for a rich console: one line, control characters visible, markup escaped."""
    return _markup_escape(printable(str(text), keep_newlines=False))

_AUTO_DEPTH_LIMIT = 80  # state dicts with more tensors are shown 3 levels deep by default


def human_count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def _dtypes(infos: dict[str, TensorInfo]) -> str:
    counts: dict[str, int] = {}
    for info in infos.values():
        counts[info.dtype] = counts.get(info.dtype, 0) + 1
    return ", ".join(f"{d}×{n}" if len(counts) > 1 else d for d, n in counts.items())


def _nest(infos: dict[str, TensorInfo], separator: str) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for key, info in infos.items():
        node = root
        parts = key.split(separator)
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):  # a tensor and a module share a name
                child = node.setdefault(part + separator, {})
            node = child
        node[parts[-1]] = info
    return root


def _total(node: Any) -> tuple[int, int]:
    if isinstance(node, TensorInfo):
        return 1, node.numel
    tensors = params = 0
    for child in node.values():
        t, p = _total(child)
        tensors, params = tensors + t, params + p
    return tensors, params


def _add(tree: Tree, node: dict[str, Any], depth: int, max_depth: int | None) -> None:
    for name, child in node.items():
        if isinstance(child, TensorInfo):
            tree.add(f"{escape(name)}  [bold]{child.shape_text()}[/bold]  [dim]{escape(child.dtype)}[/dim]")
            continue
        tensors, params = _total(child)
        label = f"[cyan]{escape(name)}[/cyan]  [dim]{tensors} tensors, {human_count(params)} params[/dim]"
        branch = tree.add(label)
        if max_depth is None or depth + 1 < max_depth:
            _add(branch, child, depth + 1, max_depth)


def state_dict_tree(sd: StateDict, *, max_depth: int | None = None, separator: str = ".") -> Tree:
    infos = sd.infos()
    if max_depth is None and len(infos) > _AUTO_DEPTH_LIMIT:
        max_depth = 3
    title = f"'{sd.where}'" if sd.where else "(root)"
    role = " — recovered from a pickled nn.Module" if sd.role == "whole-model" else ""
    tree = Tree(f"[bold]{escape(title)}[/bold]: {len(infos)} tensors, "
                f"{human_count(sd.parameter_count)} values, {escape(_dtypes(infos))}{role}")
    _add(tree, _nest(infos, separator), 0, max_depth)
    return tree


def print_inspect(ckpt: Checkpoint, file: IO[str], *, max_depth: int | None = None) -> None:
    console = Console(file=file, highlight=False, soft_wrap=False, **no_color_options())
    mode = {
        "weights_only": "read inertly: only tensor and container rebuild functions, nothing executed",
        "placeholders": "NOT loaded: classes outside the allowlist shown as placeholders, nothing executed",
        "trusted": "loaded with --trust (pickle code allowed to run)",
        "tensors-only": "tensor file, no code involved",
        "not-loaded": "NOT loaded: scanned only, nothing executed",
    }[ckpt.read_mode]
    console.print(f"[bold]{escape(ckpt.path)}[/bold] · {escape(ckpt.format)} · {mode}", soft_wrap=True)
    if ckpt.metadata:
        console.print("[dim]metadata: " + escape(", ".join(f"{k}={v}" for k, v in ckpt.metadata.items())) + "[/dim]")
    if ckpt.keras_layers:
        tree = Tree(f"[bold]Keras layers[/bold]: {len(ckpt.keras_layers)} with weights")
        for layer in ckpt.keras_layers:
            branch = tree.add(f"[cyan]{escape(layer.name)}[/cyan]  [dim]{escape(layer.kind)}[/dim]")
            for name, array in layer.weights.items():
                info = TensorInfo.of(array)
                branch.add(f"{escape(name)}  [bold]{info.shape_text()}[/bold]  [dim]{escape(info.dtype)}[/dim]")
        console.print(tree)
    else:
        separator = "/" if ckpt.format.startswith("tf-") else "."  # TensorFlow names are paths
        for sd in ckpt.state_dicts:
            console.print(state_dict_tree(sd, max_depth=max_depth, separator=separator))
    if ckpt.other_entries:
        from nndoctor.commands.ckpt.bookkeeping import bookkeeping_lines

        console.print("[bold]other entries[/bold]")
        lines = bookkeeping_lines(ckpt.other_entries)
        for line in lines[:_OTHER_ENTRIES_SHOWN]:
            console.print(f"  {escape(line)}", soft_wrap=True)  # long keys are not cut mid-word
        if len(lines) > _OTHER_ENTRIES_SHOWN:
            console.print(f"  [dim]… {len(lines) - _OTHER_ENTRIES_SHOWN} more (all in --json)[/dim]")
    if not ckpt.state_dicts and not ckpt.keras_layers:
        console.print("[yellow]no tensors found[/yellow]")
    console.print()


def print_diff(mapping: KeyMapping, source: str, target: str, file: IO[str], *,
               tensorflow: bool = False) -> None:
    console = Console(file=file, highlight=False, soft_wrap=False, **no_color_options())
    console.print(f"[bold]diff[/bold] {escape(source)} → {escape(target)}")
    console.print(f"  {mapping.exact} keys match as they are; "
                  f"{mapping.matched} match after the mapping")
    if mapping.rules:
        console.print("[bold]proposed mapping[/bold]")
        for rule in mapping.rules:
            console.print(f"  {escape(rule.describe())}  [dim]({rule.count} keys)[/dim]")
    renamed = [(s, t) for s, t in mapping.source_to_target.items() if s != t]
    for s, t in renamed[:12]:
        console.print(f"    [dim]{escape(s)} → {escape(t)}[/dim]")
    if len(renamed) > 12:
        console.print(f"    [dim]… {len(renamed) - 12} more[/dim]")
    sections = (
        ("head changed", [f"{d}: {si.shape_text()} → {di.shape_text()}" for _s, d, si, di in mapping.head_changes]),
        ("shape mismatches", [f"{d}: {si.shape_text()} → {di.shape_text()}" for _s, d, si, di in mapping.shape_mismatches]),
        (f"unexpected (only in {source})", mapping.unexpected),
        (f"missing (only in {target})", mapping.missing),
    )
    for title, lines in sections:
        if lines:
            console.print(f"[bold]{escape(title)}[/bold]: {len(lines)}")
            for line in lines[:12]:
                console.print(f"  {escape(line)}")
            if len(lines) > 12:
                console.print(f"  [dim]… {len(lines) - 12} more[/dim]")
    if mapping.loads_strictly and tensorflow:  # restored by object path, not by load_state_dict
        console.print("[green]same variables at the same object paths, shapes and dtypes[/green]")
    elif mapping.loads_strictly:
        console.print("[green]after the mapping, load_state_dict(strict=True) succeeds[/green]")
    console.print()
