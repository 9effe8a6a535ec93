"""Where dataset bytes come from: local files, or fsspec URLs (s3://, gs://, …) read in place.

Remote files are opened as seekable file objects, so readers that seek (tar headers, Parquet
footers, HDF5 B-trees, NumPy headers) fetch only the byte ranges they touch; nothing is
downloaded whole. fsspec and the backend for a protocol (s3fs, gcsfs …) are optional and
imported only when a URL is given. Credentials come from the backend's usual environment
(AWS_* variables and ~/.aws for s3fs, GOOGLE_APPLICATION_CREDENTIALS for gcsfs …).
"""

from __future__ import annotations

import os
import re
from typing import IO, Any

from nndoctor.commands.data.regular import open_regular
from nndoctor.util.errors import UsageError

_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
# Backends named in the message when a protocol's package is missing.
_BACKENDS = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs",
             "hf": "huggingface_hub", "http": "aiohttp", "https": "aiohttp"}
# Bytes fetched per ranged read of a remote file: large enough to amortise a request, small
# enough that reading one tar member or Parquet page does not pull the file.
REMOTE_BLOCK = 1 << 20


def is_url(path: str) -> bool:
    return bool(_URL.match(path)) and not path.startswith("file://")


def filesystem(url: str) -> tuple[Any, str]:
    """(fsspec filesystem, path within it) for a URL; a clear UsageError when the backend is missing."""
    protocol = url.split("://", 1)[0].lower()
    try:
        import fsspec
    except ImportError:
        raise UsageError(f"{url}: reading URLs needs fsspec: pip install 'nndoctor[s3]' "
                         f"(or fsspec and {_BACKENDS.get(protocol, 'the backend for ' + protocol)})") from None
    try:
        fs, path = fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as error:
        backend = _BACKENDS.get(protocol, f"an fsspec backend for {protocol}://")
        raise UsageError(f"{url}: cannot open this URL ({error}); install {backend}") from None
    return fs, path


def open_input(path: str) -> IO[bytes]:
    """A seekable binary file object for a local path (regular files only) or a URL."""
    if not is_url(path):
        return open_regular(path)
    fs, inner = filesystem(path)
    return fs.open(inner, "rb", block_size=REMOTE_BLOCK, cache_type="readahead")


def read_bytes(path: str, limit: int) -> bytes:
    """The whole content of one (small) file, at most ``limit`` + 1 bytes."""
    if not is_url(path):
        with open_regular(path) as handle:
            return handle.read(min(limit, os.fstat(handle.fileno()).st_size + 1))
    fs, inner = filesystem(path)
    with fs.open(inner, "rb", cache_type="none") as handle:
        return handle.read(limit + 1)


def read_head(path: str, size: int) -> bytes:
    with open_input(path) as handle:
        return handle.read(size)


def read_tail(path: str, size: int) -> bytes:
    with open_input(path) as handle:
        handle.seek(0, os.SEEK_END)
        end = handle.tell()
        handle.seek(max(0, end - size))
        return handle.read(size)


def join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name if is_url(base) else os.path.join(base, name)


def basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1] if is_url(path) else os.path.basename(os.path.normpath(path))


def url_kind(url: str) -> str:
    """"dir", "file" or "missing" for a URL."""
    fs, inner = filesystem(url)
    try:
        info = fs.info(inner)
    except FileNotFoundError:
        return "missing"
    except OSError as error:
        raise UsageError(f"{url}: cannot read ({error})") from None
    return "dir" if info.get("type") == "directory" else "file"


def url_glob(pattern: str) -> list[str]:
    fs, inner = filesystem(pattern)
    protocol = pattern.split("://", 1)[0]
    return [f"{protocol}://{p}" for p in sorted(fs.glob(inner))]


def url_listing(url: str) -> list[tuple[str, int]]:
    """(url, size) of every file below a URL prefix, recursively (object stores list flat)."""
    fs, inner = filesystem(url)
    protocol = url.split("://", 1)[0]
    found = fs.find(inner, detail=True)
    return sorted((f"{protocol}://{p}", int(info.get("size") or 0)) for p, info in found.items()
                  if info.get("type") != "directory")
