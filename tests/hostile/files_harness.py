"""Shared tools for the hostile-file tests: hand-built pickle payloads and a limited subprocess.

Payloads only ever create a marker file in the test's temp folder; the tests assert that the
marker never appears. The only place a payload is unpickled is ``prove_payloads`` (a throwaway
subprocess), which guards against tests that pass because a payload was broken.
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests import childproc

# ---------------------------------------------------------------------------------------------
# Pickle payloads written opcode by opcode, for every protocol.


@dataclass(frozen=True)
class Global:
    module: str
    name: str


@dataclass(frozen=True)
class Call:
    func: object
    args: tuple


@dataclass(frozen=True)
class Ext:
    code: int


class EmptyDict:
    pass


def _emit(node: object, proto: int) -> bytes:
    if isinstance(node, str):
        if proto == 0:
            return b"V" + node.encode("raw_unicode_escape") + b"\n"
        data = node.encode("utf-8")
        return b"X" + struct.pack("<I", len(data)) + data
    if isinstance(node, bool):
        raise TypeError("no bools")
    if isinstance(node, int):
        return b"I%d\n" % node if proto == 0 or not -(2**31) <= node < 2**31 else b"J" + struct.pack("<i", node)
    if isinstance(node, EmptyDict):
        return b"(d" if proto == 0 else b"}"
    if isinstance(node, Global):
        if proto >= 4:
            return _short(node.module) + _short(node.name) + b"\x93"
        return b"c" + node.module.encode() + b"\n" + node.name.encode() + b"\n"
    if isinstance(node, Ext):
        return b"\x82" + bytes([node.code])
    if isinstance(node, Call):
        return _emit(node.func, proto) + b"(" + b"".join(_emit(a, proto) for a in node.args) + b"tR"
    raise TypeError(node)


def _short(text: str) -> bytes:
    data = text.encode()
    return b"\x8c" + bytes([len(data)]) + data


def dump(node: object, proto: int) -> bytes:
    """Bytes of a pickle of ``node`` in protocol ``proto`` (0–5)."""
    head = b"\x80" + bytes([proto]) if proto >= 2 else b""
    return head + _emit(node, proto) + b"."


def touch(marker: Path) -> str:
    return f"touch {marker}"


def payloads(marker: Path) -> dict[str, object]:
    """Code-running pickles by technique; each creates ``marker`` when unpickled."""
    cmd = touch(marker)
    py = f"import os; os.system({cmd!r})"
    builtin_import = Call(Global("builtins", "__import__"), ("os",))
    return {
        "os.system": Call(Global("os", "system"), (cmd,)),
        "posix.system": Call(Global("posix", "system"), (cmd,)),
        "timeit.timeit": Call(Global("timeit", "timeit"), (py, "pass", Global("time", "perf_counter"), 1)),
        "numpy-runstring": Call(Global("numpy.testing._private.utils", "runstring"), (py, EmptyDict())),
        "pdb.run": Call(Global("pdb", "run"), (py,)),
        "getattr-import-chain": Call(Call(Global("builtins", "getattr"), (builtin_import, "system")), (cmd,)),
        "operator.methodcaller": Call(Call(Global("operator", "methodcaller"), ("system", cmd)), (builtin_import,)),
        "subprocess.getoutput": Call(Global("subprocess", "getoutput"), (cmd,)),
    }


EXT_CODE = 0x5A  # a copyreg extension code: names a global without spelling it out


def ext_payload(marker: Path) -> object:
    return Call(Ext(EXT_CODE), (touch(marker),))


PROVE_SCRIPT = r"""
import copyreg, json, os, pickle, sys
copyreg.add_extension("os", "system", int(sys.argv[2]))
results = {}
for name, path in json.loads(open(sys.argv[1]).read()).items():
    try:
        pickle.loads(open(path, "rb").read())
    except BaseException as error:
        results[name] = repr(error)
    else:
        results[name] = "ok"
print(json.dumps(results))
"""


def prove_payloads(files: dict[str, Path], tmp: Path) -> dict[str, str]:
    """Unpickle each file in a throwaway subprocess (cwd ``tmp``); only ever for self-tests."""
    listing = tmp / "payloads.json"
    listing.write_text(json.dumps({k: str(v) for k, v in files.items()}))
    done = childproc.run([sys.executable, "-c", PROVE_SCRIPT, str(listing), str(EXT_CODE)], cwd=tmp,
                          timeout=60, stdin=subprocess.DEVNULL)
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------
# Running nndoctor under limits.

# The address-space limit is set once the heavy libraries are imported (torch alone maps ~3.3 GB
# of address space, more with CUDA builds): what the cases get on top is this headroom, so a
# 1.5 GB allocation cannot fit while real work does.
HEADROOM = int(os.environ.get("NNDOCTOR_TEST_AS_HEADROOM_MB", "1024")) << 20
TIME_LIMIT_S = 30

_LIMITED_MAIN = r"""
import contextlib, io, json, resource, sys, time, traceback
from nndoctor.cli import main
for module in ("torch", "numpy", "h5py", "safetensors.torch", "PIL.Image", "nndoctor.commands.ckpt.reader",
               "nndoctor.commands.data.scan", "nndoctor.commands.explain.cli"):
    try:
        __import__(module)
    except ImportError:
        pass
with open("/proc/self/status") as status:
    size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
limit = size + int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
results = []
for argv in json.loads(open(sys.argv[2]).read()):
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as error:
            code = error.code
        except BaseException:
            code = "crash"
            err.write(traceback.format_exc())
    results.append({"code": code, "out": out.getvalue(), "err": err.getvalue(),
                    "seconds": time.monotonic() - started})
open(sys.argv[3], "w").write(json.dumps(results))
"""


@dataclass
class Limited:
    code: object
    out: str
    err: str
    seconds: float
    json: dict | None


def run_limited(cases: list[tuple[object, ...]], *, cwd: Path, env: dict | None = None) -> list[Limited]:
    """Run ``nndoctor ARGV`` for each case, one after the other, in ONE subprocess under RLIMIT_AS.

    One process keeps the cost to a single torch import; each case is timed on its own. A case
    whose argv holds ``--json PATH`` gets that file parsed into ``json``.
    """
    argvs = [[str(a) for a in case] for case in cases]
    listing, results_path = cwd / "limited-cases.json", cwd / "limited-results.json"
    listing.write_text(json.dumps(argvs))
    full_env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", NO_COLOR="1",
                    NNDOCTOR_CACHE_DIR=str(cwd / ".cache"))
    full_env.update(env or {})
    done = subprocess.run([sys.executable, "-c", _LIMITED_MAIN, str(HEADROOM), str(listing),
                           str(results_path)], cwd=cwd, capture_output=True, env=full_env,
                          stdin=subprocess.DEVNULL, timeout=60 + TIME_LIMIT_S * len(argvs))
    assert results_path.exists(), done.stderr.decode("utf-8", "replace")[-3000:]
    results = []
    for argv, raw in zip(argvs, json.loads(results_path.read_text())):
        json_path = Path(argv[argv.index("--json") + 1]) if "--json" in argv else None
        data = json.loads(json_path.read_text()) if json_path is not None and json_path.is_file() else None
        results.append(Limited(raw["code"], raw["out"], raw["err"], raw["seconds"], data))
    return results


# C0 controls except \n and \t, DEL, C1 controls: none may reach the terminal raw.
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def assert_no_raw_controls(text: str) -> None:
    found = RAW_CONTROL.search(text)
    assert found is None, f"raw control character {found.group()!r} in output: {text[max(0, found.start() - 40):found.end() + 40]!r}"


# ---------------------------------------------------------------------------------------------
# Decompression bombs, built in well under a second: one 16 MB block of zeros is deflated once
# (ending on a full flush, so the block stands alone) and repeated.

_CHUNK = 1 << 24


def deflate_repeated(prefix: bytes, total: int) -> tuple[bytes, int, int]:
    """A raw deflate stream of ``prefix`` + zeros up to ``total`` bytes: (stream, crc32, size)."""
    import zlib

    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    parts = [compressor.compress(prefix) + compressor.flush(zlib.Z_FULL_FLUSH)]
    remaining = total - len(prefix)
    crc = zlib.crc32(prefix)
    block = compressor.compress(bytes(_CHUNK)) + compressor.flush(zlib.Z_FULL_FLUSH)
    zeros = bytes(_CHUNK)
    while remaining >= _CHUNK:
        parts.append(block)
        crc = zlib.crc32(zeros, crc)
        remaining -= _CHUNK
    if remaining:
        parts.append(compressor.compress(bytes(remaining)))
        crc = zlib.crc32(bytes(remaining), crc)
    parts.append(compressor.flush())
    return b"".join(parts), crc, total


def write_zip(path: Path, members: list[tuple[str, bytes, int, int, bool]]) -> None:
    """A zip from (name, data, crc32, uncompressed size, deflated) members (no zip64)."""
    body, central = bytearray(), bytearray()
    for name, data, crc, size, deflated in members:
        method = 8 if deflated else 0
        encoded = name.encode()
        offset = len(body)
        body += struct.pack("<4s5H3I2H", b"PK\x03\x04", 20, 0, method, 0, 0x21, crc, len(data), size,
                            len(encoded), 0) + encoded + data
        central += struct.pack("<4s6H3I5H2I", b"PK\x01\x02", 20, 20, 0, method, 0, 0x21, crc, len(data), size,
                               len(encoded), 0, 0, 0, 0, 0, offset) + encoded
    end = struct.pack("<4s4H2IH", b"PK\x05\x06", 0, 0, len(members), len(members), len(central), len(body), 0)
    path.write_bytes(bytes(body + central + end))


def stored(name: str, data: bytes) -> tuple[str, bytes, int, int, bool]:
    import zlib

    return name, data, zlib.crc32(data), len(data), False


def gzip_bomb(path: Path, prefix: bytes, total: int) -> None:
    """A gzip file of ``prefix`` + zeros, ``total`` bytes once inflated."""
    stream, crc, size = deflate_repeated(prefix, total)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
    path.write_bytes(header + stream + struct.pack("<II", crc, size & 0xFFFFFFFF))
