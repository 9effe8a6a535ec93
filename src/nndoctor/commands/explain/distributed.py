"""Explanations of distributed-training crashes: E129 DDP parameters without gradient, E130 a
collective that timed out, E131 the rendezvous port already in use, E132 ranks passing
different tensors to one collective, and X110 (ranks in different collectives) as the
collective-consistency check reports it."""

from __future__ import annotations

import re
from typing import Any

from nndoctor.commands.explain.base import CrashExplanation, variant
from nndoctor.commands.explain.crash import Crash
from nndoctor.core.findings import Finding
from nndoctor.core.registry import register


def ddp_parameter_names(crash: Crash) -> list[str] | None:
    """The names DDP's parameter indices refer to (parameters requiring grad, in module order),
    from the live run's DistributedDataParallel model."""
    session = crash.session
    if session is None:
        return None
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:
        return None
    for root in list(getattr(session.state, "roots", [])):
        if isinstance(root, DistributedDataParallel):
            seen: set[int] = set()
            names = []
            for name, param in root.module.named_parameters():
                if param.requires_grad and id(param) not in seen:
                    seen.add(id(param))
                    names.append(name)
            return names
    return None


def owning_modules(parameter_names: list[str]) -> list[str]:
    """``aux_head`` for ``aux_head.weight`` and ``aux_head.bias`` (order kept, no repeats)."""
    modules: list[str] = []
    for name in parameter_names:
        owner = name.rpartition(".")[0] or "(root)"
        if owner not in modules:
            modules.append(owner)
    return modules


@register
class DdpUnusedParameters(CrashExplanation):
    """
    ## What it does
    Explains "Expected to have finished reduction in the prior iteration before starting a new
    one": names the parameters that received no gradient in the previous iteration (from the
    indices in the message, mapped to names on the live DDP model, or from the names
    `TORCH_DISTRIBUTED_DEBUG=INFO` prints) and the modules they belong to.

    ## Why is this bad?
    DDP waits for a gradient of every parameter before it all-reduces a bucket. A module that
    did not contribute to the loss (an auxiliary head used only sometimes, a branch not taken,
    an output left out of the loss) never produces one, so the reduction never finishes and
    the next forward fails.

    ## Example
    ```python
    model = DDP(TwoHeads())              # aux_head only used when aux=True
    loss = loss_fn(model(x), y)
    ```

    ## Use instead
    Make every parameter take part in the loss, or build the wrapper with
    `DDP(model, find_unused_parameters=True)` (slower: it traverses the graph each step), or
    freeze the unused parameters (`requires_grad_(False)`) before wrapping.

    ## References
    - PyTorch docs, DistributedDataParallel `find_unused_parameters`: https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html
    - pytorch/pytorch PR #22219 (how DDP reduces the gradients of unused parameters): https://github.com/pytorch/pytorch/pull/22219
    """

    code = "E129"
    name = "ddp-unused-parameters"
    summary = "Expected to have finished reduction in the prior iteration — name the parameters and why"
    fix = "let every parameter contribute to the loss, or DDP(model, find_unused_parameters=True)"
    patterns = (r"Expected to have finished reduction in the prior iteration",)
    order = 20

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        text = crash.text
        rank = None
        indices: list[int] = []
        found = re.search(r"Parameter indices which did not receive grad for rank (\d+): ([\d ]+)", text)
        if found:
            rank = int(found.group(1))
            indices = [int(i) for i in found.group(2).split()]
        named = re.search(r"Parameters which did not receive grad for rank \d+: ([\w., ]+)", text)
        names = [n.strip() for n in named.group(1).split(",") if n.strip()] if named else []
        if not names and indices:
            known = ddp_parameter_names(crash) if crash.is_live else None
            if known:
                names = [known[i] for i in indices if i < len(known)]
        evidence: dict[str, Any] = {"parameter_indices": indices}
        if rank is not None:
            evidence["rank"] = rank
        if names:
            modules = owning_modules(names)
            evidence.update({"parameters": names, "modules": modules})
            message = (f"DDP never received a gradient for {', '.join(names)} in the previous iteration: "
                       f"module{'s' if len(modules) != 1 else ''} {', '.join(modules)} did not contribute "
                       "to the loss (its forward was not called, or its output did not reach the loss), "
                       "so the gradient all-reduce could not finish and this forward refused to start.")
        else:
            shown = ", ".join(map(str, indices)) or "unknown"
            message = ("DDP never received a gradient for some parameters in the previous iteration "
                       f"(parameter indices {shown}): their modules did not contribute to the loss, so "
                       "the gradient all-reduce could not finish.")
        return cls.make(crash, message, evidence=evidence)


@register
class CollectiveTimeout(CrashExplanation):
    """
    ## What it does
    Explains a collective that timed out — gloo's "Timed out waiting Nms for recv operation"
    or NCCL's "Watchdog caught collective operation timeout" — with the operation and the
    timeout from the message.

    ## Why is this bad?
    A collective completes only when every rank of the group calls it. A timeout means at
    least one rank never arrived: it crashed first (its own error is the real cause), is stuck
    elsewhere, skipped the call in a rank-conditional branch, or did much longer work (a
    rank-0-only checkpoint or evaluation) than the timeout allows.

    ## Example
    ```python
    if dist.get_rank() == 0:
        dist.all_reduce(metric)       # the other ranks never call it
    ```

    ## Use instead
    Call each collective on every rank; look for the first error in the other ranks' logs;
    raise `timeout=` in `init_process_group` only for legitimately long one-rank work.

    ## References
    - PyTorch docs, init_process_group `timeout`: https://pytorch.org/docs/stable/distributed.html#torch.distributed.init_process_group
    - PyTorch docs, debugging torch.distributed (TORCH_DISTRIBUTED_DEBUG, monitored_barrier): https://pytorch.org/docs/stable/distributed.html#debugging-torch-distributed-applications
    """

    code = "E130"
    name = "collective-timeout"
    summary = "NCCL/gloo watchdog timeout"
    fix = "find the rank that did not reach this collective (its log's first error, or a rank-conditional call)"
    patterns = (
        r"Timed out waiting (?P<ms>\d+)ms for (?P<op>recv|send) operation",
        r"Watchdog caught collective operation timeout:\s*WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<optype>\w+)"
        r".*?Timeout\(ms\)=(?P<ms2>\d+)\)",
        # With TORCH_NCCL_BLOCKING_WAIT the waiting call reports it (ProcessGroupNCCL.cpp, WorkNCCL::wait).
        r"Work WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<optype>\w+).*?Timeout\(ms\)=(?P<ms2>\d+)\) "
        r"timed out in blocking wait",
    )
    # c10's logger prints both on their own ("[rank1]:[E626 06:24:44.9 ProcessGroupNCCL.cpp:616] [Rank 1]
    # Watchdog caught …"), then the process aborts with no Python exception.
    log_lines = (r"Watchdog caught collective operation timeout: ?(?:WorkNCCL\(SeqNum=|$)",
                 r"Work WorkNCCL\(SeqNum=\d+, OpType=\w+.*?timed out in blocking wait")
    # A log viewer may wrap the line after "timeout: " (the WorkNCCL(…) part then starts the next line).
    log_context_lines = 1
    order = 20

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        ms = int(facts.get("ms") or facts.get("ms2") or 0)
        operation = facts.get("optype") or f"a gloo {facts.get('op', 'collective')}"
        evidence: dict[str, Any] = {"timeout_s": ms / 1000, "operation": operation}
        if facts.get("seq"):
            evidence["sequence_number"] = int(facts["seq"])
        message = (f"The collective ({operation}) waited {ms / 1000:g} s for the other ranks and timed out: "
                   "at least one rank never reached the matching call — it crashed earlier, is blocked "
                   "elsewhere, skipped it in a rank-conditional branch, or is busy with longer one-rank work.")
        return cls.make(crash, message, evidence=evidence)


_C10D_WORDS = re.compile(r"server socket|TCPStore|\[c10d\]|c10d::|DistNetworkError|rendezvous|MASTER_PORT")


@register
class AddressInUse(CrashExplanation):
    """
    ## What it does
    Explains "The server socket has failed to listen ... EADDRINUSE" / "Address already in use"
    when a process group or torchrun's rendezvous starts, naming the port.

    ## Why is this bad?
    Rank 0 (or the torchrun agent) listens on `MASTER_PORT` (default 29500). Another job on
    the same machine — often an earlier run that has not exited — already holds it, so the
    new job cannot start.

    ## Example
    ```bash
    torchrun --nproc_per_node 2 train.py     # while another torchrun still holds 29500
    ```

    ## Use instead
    ```bash
    torchrun --standalone --nproc_per_node 2 train.py          # picks a free port
    torchrun --master_port 29511 --nproc_per_node 2 train.py   # or choose one yourself
    ```

    ## References
    - PyTorch docs, torchrun (`--standalone`, `--master-port`, `--rdzv-endpoint`): https://pytorch.org/docs/stable/elastic/run.html
    """

    code = "E131"
    name = "address-in-use"
    summary = "rendezvous port already in use"
    fix = "use torchrun --standalone (a free port), another --master_port, or stop the job that holds the port"
    # On Windows the socket error is WSAEADDRINUSE, printed by number and in the system's language
    # ("(system error: 10048 - Only one usage of each socket address …)").
    patterns = (r"EADDRINUSE", r"[Aa]ddress already in use", r"The server socket has failed to \w+ (?:to|on) \S+ \(system error: 10048 ")
    # c10d's TCPStore logs each failed bind before raising ("[W socket.cpp:436] [c10d] The server
    # socket has failed to bind to [::]:29500 (errno: 98 - Address already in use)."); other
    # programs' "Address already in use" (a web UI, TensorBoard) is not this cause.
    log_lines = (r"The server socket has failed to (?:bind to|listen on)[^\n]*(?:Address already in use|EADDRINUSE)",
                 r"The server socket has failed to (?:bind to|listen on) \S+ \(system error: 10048 ")
    order = 20

    @classmethod
    def match(cls, crash: Crash) -> dict[str, Any] | None:
        facts = super().match(crash)
        # "Address already in use" is any server's error (TensorBoard, a web UI): only c10d's store
        # or a torch.distributed frame makes it the rendezvous port.
        if facts is None or not (_C10D_WORDS.search(crash.text)
                                 or any("torch/distributed" in f.path.replace("\\", "/") for f in crash.frames)):
            return None
        return facts

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        port = re.search(r"port: (\d+)", crash.text) or re.search(r":(\d{2,5})\b.*?[Aa]ddress already in use", crash.text)
        evidence = {"port": int(port.group(1))} if port else {}
        where = f"port {port.group(1)}" if port else "the rendezvous port"
        message = (f"The process group could not listen on {where}: another process on this machine "
                   "already uses it (often an earlier run that is still alive, or a second job with the "
                   "same MASTER_PORT).")
        return cls.make(crash, message, evidence=evidence)


@register
class CollectiveShapeMismatch(CrashExplanation):
    """
    ## What it does
    Explains "Detected mismatch between collectives on ranks" (printed with
    `TORCH_DISTRIBUTED_DEBUG=DETAIL`) and gloo's "op.preamble.length <= op.nbytes": the ranks
    called one collective with tensors of different shapes (different collectives are X110).

    ## Why is this bad?
    A collective combines the same tensor from every rank. Different sizes — a last batch
    smaller on one rank, a per-rank list of variable length, a rank-dependent shape — make
    gloo abort, and NCCL may hang or silently read past the smaller buffer.

    ## Example
    ```python
    dist.all_reduce(torch.tensor(per_rank_losses))   # a different length on each rank
    ```

    ## Use instead
    Reduce fixed-size tensors (a sum and a count), pad to a common size, or use
    `all_gather_object` for variable-size data.

    ## References
    - PyTorch docs, debugging torch.distributed (TORCH_DISTRIBUTED_DEBUG=DETAIL checks collective shapes): https://pytorch.org/docs/stable/distributed.html#debugging-torch-distributed-applications
    """

    code = "E132"
    name = "collective-shape-mismatch"
    summary = "ranks passing tensors of different shapes to one collective"
    fix = "give the collective a tensor of the same shape on every rank (reduce a sum and a count, or pad)"
    patterns = (
        r"Detected mismatch between collectives on ranks\. Rank (?P<rank_a>\d+) is running collective: "
        r"CollectiveFingerPrint\(SequenceNumber=(?P<seq>\d+), OpType=(?P<op_a>\w+), TensorShape=(?P<shape_a>\[[^\]]*\])"
        r".*?but Rank (?P<rank_b>\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=\d+, "
        r"OpType=(?P<op_b>\w+), TensorShape=(?P<shape_b>\[[^\]]*\])",
        r"op\.preamble\.length <= op\.nbytes\. (?P<bytes_a>\d+) vs (?P<bytes_b>\d+)",
    )
    order = 20

    log_lines = (r"Detected mismatch between collectives on ranks\. Rank \d+ is running collective: "
                 r"CollectiveFingerPrint\(SequenceNumber=\d+, OpType=\w+, TensorShape=",)

    @classmethod
    def match(cls, crash: Crash) -> dict[str, Any] | None:
        facts = super().match(crash)
        if facts and "op_a" in facts and facts["op_a"] != facts["op_b"]:
            return None  # different collectives: X110's cause, not a shape mismatch
        return facts

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        if "bytes_a" in facts:
            evidence: dict[str, Any] = {"bytes_received": int(facts["bytes_a"]),
                                        "bytes_expected": int(facts["bytes_b"])}
            message = (f"gloo received {facts['bytes_a']} bytes for a collective whose buffer on this rank "
                       f"holds {facts['bytes_b']}: the ranks passed tensors of different sizes to the same call.")
            return cls.make(crash, message, evidence=evidence)
        a, b = facts["rank_a"], facts["rank_b"]
        evidence = {f"rank_{a}": f"{facts['op_a']} {facts['shape_a']}", f"rank_{b}": f"{facts['op_b']} {facts['shape_b']}",
                    "sequence_number": int(facts["seq"])}
        what = f"tensors of different shapes ({facts['shape_a']} vs {facts['shape_b']})"
        message = (f"Rank {a} called {facts['op_a']} with shape {facts['shape_a']} while rank {b} called "
                   f"{facts['op_b']} with shape {facts['shape_b']} (collective #{facts['seq']}): the ranks "
                   f"passed {what} to one collective.")
        return cls.make(crash, message, evidence=evidence)


@variant
class CollectiveMismatchReported(CrashExplanation):
    """
    ## What it does
    From a log: explains "Detected mismatch between collectives on ranks" (the consistency
    check of ``TORCH_DISTRIBUTED_DEBUG=DETAIL``) when the ranks ran different collectives
    (different operations, or the same operation at different sequence numbers), naming
    both ranks' calls.

    ## References
    - PyTorch docs, debugging torch.distributed (TORCH_DISTRIBUTED_DEBUG=DETAIL checks that ranks run the same collectives): https://pytorch.org/docs/stable/distributed.html#debugging-torch-distributed-applications
    """

    code = "X110"
    name = "collective-mismatch"
    summary = "ranks in different collectives / a rank-conditional collective (hang)"
    fix = "call every collective on every rank in the same order (no collective inside `if rank == ...`)"
    patterns = (
        r"Detected mismatch between collectives on ranks\. Rank (?P<rank_a>\d+) is running collective: "
        r"CollectiveFingerPrint\(SequenceNumber=(?P<seq_a>\d+), OpType=(?P<op_a>\w+)"
        # A rank that has not run the collective prints a short fingerprint, with no comma
        # before OpType ("CollectiveFingerPrint(SequenceNumber=0OpType=REDUCE)").
        r".*?but Rank (?P<rank_b>\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=(?P<seq_b>\d+),? ?"
        r"OpType=(?P<op_b>\w+)",
    )
    log_lines = (r"Detected mismatch between collectives on ranks\. Rank \d+ is running collective: "
                 r"CollectiveFingerPrint\(SequenceNumber=",)
    order = 19  # before E132, which explains the same message when only the shapes differ
    preamble_evidence = False

    @classmethod
    def match(cls, crash: Crash) -> dict[str, Any] | None:
        facts = super().match(crash)
        if facts is None or (facts["op_a"] == facts["op_b"] and facts["seq_a"] == facts["seq_b"]):
            return None  # the same call with different tensors is E132
        return facts

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        a, b = facts["rank_a"], facts["rank_b"]
        evidence = {f"rank_{a}": f"{facts['op_a']} #{facts['seq_a']}", f"rank_{b}": f"{facts['op_b']} #{facts['seq_b']}"}
        message = (f"Rank {a} was in {facts['op_a']} (collective #{facts['seq_a']}) while rank {b} was in "
                   f"{facts['op_b']} (collective #{facts['seq_b']}): the ranks do not run the same collectives "
                   "in the same order, so they wait on each other forever (a collective skipped or added "
                   "on some ranks, e.g. inside `if rank == 0:`).")
        return cls.make(crash, message, evidence=evidence)
