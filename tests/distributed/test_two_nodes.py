"""One report across nodes: two torchrun invocations (--nnodes 2, one rank each, separate temp
folders as two machines have) send their parts through torchrun's rendezvous store; rank 0
of node 0 merges them and finds the bug only visible across ranks (identical batches)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from nndoctor.run.distributed.transport import FolderTransport, StoreTransport, spans_nodes
from tests import childproc

FIXTURES = Path(__file__).parent.parent / "fixtures" / "distributed"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.e2e
@pytest.mark.slow
def test_two_nodes_give_one_merged_report_with_the_cross_rank_finding(tmp_path):
    port = free_port()
    processes = []
    for node in (0, 1):
        folder = tmp_path / f"node{node}"
        folder.mkdir()
        env = childproc.child_env(dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(folder)))
        env.pop("NNDOCTOR_PARTS_DIR", None)
        env.pop("NNDOCTOR_MERGE_DIR", None)
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
                   "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
                   "-m", "nndoctor", "run", "--json", str(folder / "report.json"),
                   str(FIXTURES / "ddp_same_batches.py")]
        out = open(folder / "output.txt", "w")  # noqa: SIM115 - closed below
        processes.append((subprocess.Popen(command, cwd=folder, env=env, stdout=out,
                                                     stderr=subprocess.STDOUT), out))
    for process, out in processes:
        childproc.communicate(process, childproc.scaled(240))
        out.close()
    output = [(tmp_path / f"node{n}" / "output.txt").read_text() for n in (0, 1)]
    assert all(p.returncode == 0 for p, _ in processes), output[0][-3000:] + output[1][-3000:]
    assert not (tmp_path / "node1" / "report.json").exists()  # node 0's rank 0 alone reports
    report = json.loads((tmp_path / "node0" / "report.json").read_text())
    assert report["world_size"] == 2 and report["missing_ranks"] == []
    assert sorted(r["rank"] for r in report["ranks"]) == [0, 1]
    assert all(r["status"] == "completed" and r["steps"] == 8 for r in report["ranks"])
    [same] = [f for f in report["findings"] if f["code"] == "X101"]
    assert same["ranks"] == [0, 1] and same["evidence"]["identical_batches"] == 8
    assert output[0].count("nndoctor · ") == 1 and "nndoctor · " not in output[1]
    # Nothing is left behind on the other node.
    assert not list((tmp_path / "node1").glob("nndoctor-parts-*/*"))


def test_a_launch_spans_nodes_when_its_ranks_are_not_all_local():
    assert spans_nodes({"GROUP_WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "WORLD_SIZE": "2"})
    assert spans_nodes({"LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "8"})
    assert not spans_nodes({"GROUP_WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2"})


@pytest.mark.parametrize("url", [False, True], ids=["folder", "fsspec-url"])
def test_a_named_merge_folder_carries_parts_and_one_claim(tmp_path, url):
    root = f"memory://{tmp_path.name}/merge" if url else str(tmp_path / "merge")
    sender, merger = FolderTransport(root), FolderTransport(root)
    assert merger.get("part", 1) is None
    sender.put("part", 1, {"rank": 1, "report": {"status": "completed"}})
    assert merger.get("part", 1) == {"rank": 1, "report": {"status": "completed"}}
    assert merger.claim() is True and sender.claim() is False
    merger.remove("part", 1)
    assert merger.get("part", 1) is None


def test_the_rendezvous_store_carries_parts_and_one_claim():
    from datetime import timedelta

    import torch.distributed as dist

    # The bound only limits a failure: connecting to and reading from a store on this host take
    # milliseconds, but a fixed 10 s ran out once at load 13 on a 2-core machine (the store's
    # server thread was not scheduled in time). Nothing here waits for a key that is absent
    # (get() checks first), so a long bound costs nothing when the test passes.
    timeout = timedelta(seconds=childproc.scaled(60))
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timeout)
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False, wait_for_workers=False, timeout=timeout)
    sender, merger = StoreTransport(client, "nndoctor/run/0"), StoreTransport(server, "nndoctor/run/0")
    assert merger.get("dead", 3) is None
    sender.put("dead", 3, {"rank": 3, "died": {"signal": "SIGKILL"}})
    assert merger.get("dead", 3)["died"]["signal"] == "SIGKILL"
    assert sender.claim() is True and merger.claim() is False
    merger.remove("dead", 3)
    assert merger.get("dead", 3) is None
