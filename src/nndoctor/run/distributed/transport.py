"""How the ranks' report parts reach the merging rank when the ranks run on several nodes.

On one node the parts are files in a folder of the node (``parts.py``). Ranks on other nodes
cannot see that folder, so their parts travel another way:

- the launcher's own rendezvous store (torchrun's c10d ``TCPStore`` at ``MASTER_ADDR:MASTER_PORT``,
  the key-value store torchrun itself uses between nodes): each rank sets one key, rank 0 of
  node 0 reads them. No new server, and no collective in the user's process group;
- or a folder or fsspec URL the user names (``--merge-dir``, ``NNDOCTOR_MERGE_DIR``): a shared
  filesystem or object storage such as ``s3://bucket/runs``.

Every rank still keeps its flight record in its node's folder: a rank that dies without Python
is found by a surviving rank of its own node, which forwards the dead rank's part.
"""

from __future__ import annotations

import json
import os
import posixpath
import time
from datetime import timedelta
from typing import Any

from nndoctor.run.distributed.context import RankInfo

MERGE_DIR_ENV = "NNDOCTOR_MERGE_DIR"
# Seconds to connect to the launcher's store; past that the rank keeps its part on its node.
STORE_TIMEOUT_S = float(os.environ.get("NNDOCTOR_STORE_TIMEOUT", "30"))


def spans_nodes(environ: Any = None) -> bool:
    """Does this torchrun launch have ranks on other nodes (agents) than this one?"""
    env = os.environ if environ is None else environ
    try:
        if int(env.get("GROUP_WORLD_SIZE", "1")) > 1:
            return True
        return int(env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE", "1"))) < int(env.get("WORLD_SIZE", "1"))
    except ValueError:
        return False


class StoreTransport:
    """Parts as keys of torchrun's rendezvous store, under a prefix of this launch and attempt."""

    def __init__(self, store: Any, prefix: str) -> None:
        self.store, self.prefix = store, prefix

    def _key(self, kind: str, rank: int) -> str:
        return f"{self.prefix}/{kind}/{rank}"

    def put(self, kind: str, rank: int, part: dict[str, Any]) -> None:
        key = self._key(kind, rank)
        self.store.set(key, json.dumps(part, ensure_ascii=False))
        # A TCPStore client's set() sends without waiting for the server; a request answered on
        # the same connection returns only once the set before it is stored. Without it the
        # merging rank could look (on its own connection) before the part arrived, and a rank
        # that dies right after putting its record could lose it.
        self.store.check([key])

    def get(self, kind: str, rank: int) -> dict[str, Any] | None:
        key = self._key(kind, rank)
        if not self.store.check([key]):
            return None
        value: dict[str, Any] = json.loads(self.store.get(key))
        return value

    def remove(self, kind: str, rank: int) -> None:
        self.store.delete_key(self._key(kind, rank))

    def claim(self) -> bool:
        """True for the first rank that claims the merge (an atomic counter of the store)."""
        return int(self.store.add(f"{self.prefix}/claim", 1)) == 1


class FolderTransport:
    """Parts as files of a folder every node sees, or under an fsspec URL."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._fs: Any = None
        if "://" in root:
            try:
                import fsspec
            except ImportError as error:  # pragma: no cover - fsspec is a dependency of the data extra
                raise RuntimeError("--merge-dir with a URL needs fsspec (pip install fsspec)") from error
            self._fs, self._path = fsspec.core.url_to_fs(root)
        else:
            os.makedirs(root, exist_ok=True)
            self._path = root

    def _file(self, kind: str, rank: int) -> str:
        return posixpath.join(self._path, f"{kind}-{rank}.json") if self._fs else os.path.join(self._path, f"{kind}-{rank}.json")

    def put(self, kind: str, rank: int, part: dict[str, Any]) -> None:
        data = json.dumps(part, ensure_ascii=False)
        if self._fs is not None:
            self._fs.pipe_file(self._file(kind, rank), data.encode("utf-8"))
            return
        from nndoctor.util.atomic import atomic_write_text

        atomic_write_text(self._file(kind, rank), data)

    def get(self, kind: str, rank: int) -> dict[str, Any] | None:
        path = self._file(kind, rank)
        try:
            if self._fs is not None:
                if not self._fs.exists(path):
                    return None
                text = self._fs.cat_file(path).decode("utf-8")
            else:
                with open(path, encoding="utf-8") as handle:
                    text = handle.read()
            value: dict[str, Any] = json.loads(text)
            return value
        except (OSError, ValueError, FileNotFoundError):
            return None

    def remove(self, kind: str, rank: int) -> None:
        path = self._file(kind, rank)
        try:
            if self._fs is not None:
                self._fs.rm_file(path)
            else:
                os.unlink(path)
        except (OSError, FileNotFoundError):
            pass

    def claim(self) -> bool:
        path = self._file("claim", 0)
        if self._fs is not None:
            # Object stores have no exclusive create: the first writer's token is the one read back.
            token = f"{os.getpid()}-{time.monotonic_ns()}"
            if self._fs.exists(path):
                return False
            self._fs.pipe_file(path, token.encode())
            return bool(self._fs.cat_file(path).decode() == token)
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except OSError:
            return False
        return True


def open_transport(info: RankInfo) -> StoreTransport | FolderTransport | None:
    """The way parts cross nodes for this rank, or None when every rank is on this node and no
    merge folder was named (the node's parts folder is enough)."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    merge_dir = os.environ.get(MERGE_DIR_ENV)
    if merge_dir:
        launch = f"{info.run_id}-{os.environ.get('MASTER_ADDR', '')}-{os.environ.get('MASTER_PORT', '')}-{attempt}"
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in launch)
        root = posixpath.join(merge_dir, f"nndoctor-{safe}") if "://" in merge_dir else os.path.join(merge_dir, f"nndoctor-{safe}")
        return FolderTransport(root)
    if not spans_nodes():
        return None
    import torch.distributed as dist

    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timedelta(seconds=STORE_TIMEOUT_S), wait_for_workers=False)
    return StoreTransport(store, f"nndoctor/{info.run_id}/{attempt}")
