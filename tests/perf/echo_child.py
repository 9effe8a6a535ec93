"""A stand-in re-run child for tests/perf/test_warm_launcher.py: reports its context, then ends
as argv[0] says (a return code, sys.exit, an exception, a hang, a signal)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def main(argv: list[str]) -> int:
    mode, out = argv[0], argv[1]
    with open(out, "w") as handle:
        json.dump({"argv": argv, "sys_argv": sys.argv[1:], "cwd": os.getcwd(),
                   "marker": os.environ.get("WARM_TEST_MARKER"), "stdin": sys.stdin.read(),
                   "torch_loaded": "torch" in sys.modules, "dynamo_loaded": "torch._dynamo" in sys.modules,
                   "cuda_initialized": "torch" in sys.modules and sys.modules["torch"].cuda.is_initialized(),
                   "threads": len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else None},
                  handle)
    print("to stdout", flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    if mode == "exit":
        sys.exit(3)
    if mode == "raise":
        raise ValueError("the child failed")
    if mode == "hang":
        time.sleep(600)
    if mode == "signal":
        os.kill(os.getpid(), signal.SIGKILL)
    return 5


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
