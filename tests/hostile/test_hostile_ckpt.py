"""Hostile checkpoints: code-running pickles in every protocol and container, bombs, special
files, escape sequences. Nothing may run, hang, exhaust memory or print raw control characters."""

from __future__ import annotations

import json
import os
import pickle
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import files_harness as h  # noqa: E402

from nndoctor.cli import main  # noqa: E402

PROTOCOLS = range(6)


def run_cli(capsys, *argv: object) -> tuple[int, str, str, dict | None]:
    """In-process ``nndoctor ARGV --json FILE``: (exit code, stdout, stderr, parsed JSON)."""
    args = [str(a) for a in argv]
    json_path = Path(args[args.index("--json") + 1]) if "--json" in args else None
    code = main(args)
    captured = capsys.readouterr()
    data = json.loads(json_path.read_text()) if json_path and json_path.is_file() else None
    return code, captured.out, captured.err, data


def c104(report: dict) -> dict:
    found = [f for f in report["findings"] if f["code"] == "C104"]
    assert found, [f["code"] for f in report["findings"]]
    return found[0]


class Payload:
    """Pickles as a call of ``func(*args)``: how a hostile object hides in a real checkpoint."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


# -- the payloads themselves ---------------------------------------------------------------
def test_the_payloads_run_when_unpickled(tmp_path):
    # Guard: each technique really creates its marker under plain pickle.loads (in a sandbox
    # subprocess). pdb.run waits for debugger commands, so it is only checked statically.
    files = {}
    for protocol in (0, 2, 4):
        for name in h.payloads(tmp_path):
            node = h.payloads(tmp_path / f"m-{name}-{protocol}")[name]
            if name != "pdb.run":
                files[f"{name}-{protocol}"] = tmp_path / f"{name}-{protocol}.pkl"
                files[f"{name}-{protocol}"].write_bytes(h.dump(node, protocol))
    files["ext"] = tmp_path / "ext.pkl"
    files["ext"].write_bytes(h.dump(h.ext_payload(tmp_path / "m-ext"), 2))
    results = h.prove_payloads(files, tmp_path)
    assert all(value == "ok" for value in results.values()), results
    for name in files:
        marker = tmp_path / ("m-ext" if name == "ext" else f"m-{name}")
        assert marker.exists(), name
        marker.unlink()


# -- 1. code-executing pickles are errors, exit 1, in every protocol ------------------------
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("technique", sorted(h.payloads(Path("m"))))
def test_code_running_pickle_is_c104_error(tmp_path, capsys, technique, protocol):
    marker = tmp_path / "marker"
    path = tmp_path / "evil.pt"
    path.write_bytes(h.dump(h.payloads(marker)[technique], protocol))
    code, out, err, report = run_cli(capsys, "ckpt", "inspect", path, "--json", tmp_path / "r.json")
    assert not marker.exists()
    assert code == 1, err
    finding = c104(report)
    assert finding["severity"] == "error"
    assert finding["evidence"]["unsafe_globals"], finding
    assert finding["evidence"]["dangerous_globals"], finding  # named first in the message
    assert "NOT loaded" in finding["message"]
    h.assert_no_raw_controls(out + err)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_copyreg_extension_codes_are_c104(tmp_path, capsys, protocol):
    marker = tmp_path / "marker"
    path = tmp_path / "ext.pt"
    path.write_bytes(h.dump(h.ext_payload(marker), protocol))
    code, _out, _err, report = run_cli(capsys, "ckpt", "inspect", path, "--json", tmp_path / "r.json")
    assert code == 1 and not marker.exists()
    assert any("copyreg extension" in g for g in c104(report)["evidence"]["unsafe_globals"])


@pytest.mark.parametrize("command", ["diff", "diff-second", "fix", "convert"])
def test_every_ckpt_command_exits_1_on_a_code_running_pickle(tmp_path, capsys, command):
    marker = tmp_path / "marker"
    path = tmp_path / "evil.pt"
    path.write_bytes(h.dump(h.payloads(marker)["os.system"], 2))
    good = tmp_path / "good.pt"
    torch.save({"w": torch.ones(2)}, good)
    argv = {"diff": [path, good], "diff-second": [good, path], "fix": [path, "-o", tmp_path / "out.safetensors"],
            "convert": [path, "-o", tmp_path / "out.safetensors", "--model", "never_built.py:build"]}[command]
    code, out, err, report = run_cli(capsys, "ckpt", command.split("-")[0], *argv, "--json", tmp_path / "r.json")
    assert not marker.exists()
    assert code == 1, err
    assert c104(report)["severity"] == "error"
    assert not (tmp_path / "out.safetensors").exists()


def test_shared_codes_take_the_runtime_checks_metadata():
    from nndoctor.commands.ckpt.shared_codes import shared_finding
    from nndoctor.core.registry import get_check

    for code in ("C101", "C103", "C104"):
        check = get_check(code)
        finding = shared_finding(code, "m", path="x.pt")
        assert (finding.name, finding.severity, finding.fix) == (check.name, check.severity, check.fix)


# -- 2. every container --------------------------------------------------------------------
def _evil_object(marker: Path) -> Payload:
    return Payload(os.system, h.touch(marker))


def _build_container(kind: str, tmp_path: Path, marker: Path) -> Path:
    evil = _evil_object(marker)
    tensors = {"w": torch.ones(2, 2)}
    if kind == "torch-zip":
        path = tmp_path / "evil.pt"
        torch.save({"model": tensors, "x": evil}, path)
    elif kind == "torch-legacy":
        path = tmp_path / "evil.pt"
        torch.save({"model": tensors, "x": evil}, path, _use_new_zipfile_serialization=False)
    elif kind == "torch-zip-extra-member":
        path = tmp_path / "evil.pt"
        torch.save(tensors, path)
        with zipfile.ZipFile(path, "a") as archive:
            archive.writestr("archive/extra.pkl", pickle.dumps(evil, protocol=2))
    elif kind == "legacy-tar":
        path = tmp_path / "evil.tar.pt"
        with tarfile.open(path, "w") as archive:
            for name, data in (("sys_info", pickle.dumps({}, protocol=2)), ("pickle", pickle.dumps(evil, protocol=2)),
                               ("storages", pickle.dumps(0, protocol=2)), ("tensors", pickle.dumps(0, protocol=2))):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                archive.addfile(info, __import__("io").BytesIO(data))
    elif kind == "npy-object":
        path = tmp_path / "evil.npy"
        np.save(path, np.array([evil, 1], dtype=object), allow_pickle=True)
    elif kind == "npz-object":
        path = tmp_path / "evil.npz"
        np.savez(path, weights=np.zeros(3), extra=np.array([evil], dtype=object))
    elif kind == "zip-member":
        path = tmp_path / "bundle.zip"
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("model/weights.pkl", pickle.dumps({"w": [1.0], "x": evil}, protocol=4))
    elif kind == "keras-zip-member":
        import h5py

        weights = tmp_path / "model.weights.h5"
        with h5py.File(weights, "w") as handle:
            handle.create_dataset("layers/dense/vars/0", data=np.ones((2, 2), "f4"))
            handle["layers"].attrs["meta"] = np.void(pickle.dumps(evil, protocol=2))
        path = tmp_path / "evil.keras"
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("config.json", json.dumps({"class_name": "Sequential", "config": {"layers": []}}))
            archive.write(weights, "model.weights.h5")
            archive.writestr("assets/tokenizer.pkl", pickle.dumps(evil, protocol=4))
    elif kind == "hdf5-attribute":
        import h5py

        path = tmp_path / "evil.h5"
        with h5py.File(path, "w") as handle:
            handle.create_dataset("w", data=np.zeros(3))
            handle["w"].attrs["meta"] = np.void(pickle.dumps(evil, protocol=0))
    else:
        raise AssertionError(kind)
    return path


CONTAINERS = ["torch-zip", "torch-legacy", "torch-zip-extra-member", "legacy-tar", "npy-object",
              "npz-object", "zip-member", "hdf5-attribute", "keras-zip-member"]


@pytest.mark.parametrize("kind", CONTAINERS)
def test_payload_found_in_every_container(tmp_path, capsys, kind):
    marker = tmp_path / "marker"
    path = _build_container(kind, tmp_path, marker)
    before = path.read_bytes()
    code, out, err, report = run_cli(capsys, "ckpt", "inspect", path, "--json", tmp_path / "r.json")
    assert not marker.exists()
    assert code == 1, err
    finding = c104(report)
    assert finding["severity"] == "error"
    assert any(g.endswith(".system") for g in finding["evidence"]["unsafe_globals"]), finding
    assert path.read_bytes() == before
    h.assert_no_raw_controls(out + err)


def test_text_attributes_that_start_like_a_pickle_are_not_flagged(tmp_path, capsys):
    import h5py

    path = tmp_path / "model.weights.h5"
    with h5py.File(path, "w") as handle:
        handle.create_dataset("layers/dense/vars/0", data=np.ones((2, 2), "f4"))
        handle["layers"].attrs["note"] = np.void(b"config\nvalue\nmore text")  # GLOBAL-shaped, not a pickle
    code, _out, err, report = run_cli(capsys, "ckpt", "inspect", path, "--json", tmp_path / "r.json")
    assert code == 0, err
    assert not [f for f in report["findings"] if f["code"] == "C104"]


# -- 3. hostile and broken is still hostile ---------------------------------------------------
@pytest.mark.parametrize("damage", ["truncated", "refused-while-loading"])
def test_dangerous_and_unloadable_is_still_reported_dangerous(tmp_path, capsys, damage):
    marker = tmp_path / "marker"
    evil = h.payloads(marker)["os.system"]
    if damage == "truncated":
        data = h.dump({"x": 1} and evil, 2)[:-6]
    else:
        # A valid pickle whose second half the inert reader refuses (calling torch.Tensor(n)).
        data = h.dump(h.Call(h.Global("builtins", "slice"), (evil, h.Call(h.Global("torch", "Tensor"), (10,)))), 2)
    path = tmp_path / "evil.pt"
    path.write_bytes(data)
    code, out, err, report = run_cli(capsys, "ckpt", "inspect", path, "--json", tmp_path / "r.json")
    assert not marker.exists()
    assert code == 1, err
    finding = c104(report)
    assert finding["severity"] == "error" and "os.system" in finding["evidence"]["unsafe_globals"]
    assert finding["evidence"]["read_mode"] == "not-loaded"


def test_a_pickle_naming_many_globals_stays_cheap(tmp_path, capsys):
    # 50,000 different names in 700 KB: each would become a class if nothing bounded it.
    data = b"\x80\x02(" + b"".join(b"cm%d\nf\n" % i for i in range(50_000)) + b"l."
    path = tmp_path / "names.pt"
    path.write_bytes(data)
    code, _out, err, report = run_cli(capsys, "ckpt", "inspect", path, "--json", tmp_path / "r.json")
    assert code == 1, err
    finding = c104(report)
    assert len(finding["evidence"]["unsafe_globals"]) == 50_000
    assert finding["evidence"]["read_mode"] == "not-loaded"


# -- 13. plain pickles are pickles ----------------------------------------------------------
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_plain_pickle_dump_is_identified_as_a_pickle(tmp_path, capsys, protocol):
    path = tmp_path / "plain.pkl"
    path.write_bytes(pickle.dumps({"epoch": 3, "names": ["a", "b"], "array": np.arange(4.0), "s": {1, 2}},
                                  protocol=protocol))
    code, _out, err, report = run_cli(capsys, "ckpt", "inspect", path, "--json", tmp_path / "r.json")
    assert code == 0, err
    assert report["extra"]["checkpoint"]["format"] == "pickle"
    assert not [f for f in report["findings"] if f["code"] == "C104"]
    assert report["extra"]["checkpoint"]["other_entries"]["epoch"] == "3"


# -- 5–8. bombs and special files, under an address-space limit in one subprocess --------------
def _graph_file(folder: Path) -> Path:
    node: object = {"leaf": 1}
    for _ in range(8):
        node = {"k": [node] * 200}  # pickle memoises: a few KB for 200**8 paths
    path = folder / "graph.pt"
    torch.save(node, path)
    assert path.stat().st_size < 20_000
    return path


def _zip_bomb(folder: Path) -> Path:
    stream, crc, size = h.deflate_repeated(b"\x80\x02", 1_500_000_000)
    path = folder / "zipbomb.pt"
    h.write_zip(path, [("archive/data.pkl", stream, crc, size, True), h.stored("archive/version", b"3\n")])
    assert path.stat().st_size < 2_000_000
    return path


def _allocation_bomb(folder: Path, bomb: str) -> Path:
    if bomb == "bytearray":
        data = h.dump(h.Call(h.Global("builtins", "bytearray"), (1_500_000_000,)), 2)
    elif bomb == "declared-length":
        data = b"\x80\x04\x8e" + (1_500_000_000).to_bytes(8, "little") + b"short."  # BINBYTES8
    elif bomb == "numpy-itemsize":
        data = h.dump(h.Call(h.Global("numpy._core.multiarray", "_reconstruct"),
                             (h.Global("numpy", "ndarray"), 16, "V100000000")), 2)
    elif bomb == "tensor-constructor":
        data = h.dump(h.Call(h.Global("torch", "Tensor"), (400_000_000,)), 2)
    elif bomb == "numpy-shape":
        data = h.dump(h.Call(h.Global("numpy._core.multiarray", "_reconstruct"),
                             (h.Global("numpy", "ndarray"), 1_500_000_000, "b")), 2)
    else:
        # A legacy torch file whose pickle declares a 1.5 GB storage it does not hold.
        buffer = __import__("io").BytesIO()
        torch.save({"w": torch.ones(4)}, buffer, _use_new_zipfile_serialization=False)
        data = buffer.getvalue()
        # The persistent id is ('storage', FloatStorage, key, 'cpu', numel=4, None): BININT1 4
        # right after the 'cpu' string and its memo slot.
        at = data.index(b"K\x04", data.index(b"cpu"))
        assert at - data.index(b"cpu") <= 8
        data = data[:at] + b"J" + (375_000_000).to_bytes(4, "little") + data[at + 2:]
    path = folder / f"alloc-{bomb}.pt"
    path.write_bytes(data)
    return path


def _special_file(folder: Path, special: str) -> Path:
    path = folder / f"{special}.pt"
    if special == "fifo":
        os.mkfifo(path)
    else:
        os.symlink("/dev/" + special.split("-")[1], path)
    return path


def _hdf5_file(folder: Path, kind: str) -> Path:
    import h5py

    path = folder / f"{kind}.weights.h5"
    with h5py.File(path, "w") as handle:
        dense = handle.create_group("layers/dense/vars")
        dense.create_dataset("0", data=np.ones((3, 2), "f4"))
        if kind == "hdf5-fill-bomb":
            # Never written, so never stored: 1.6 GB of fill value declared in a few KB.
            dense.create_dataset("1", shape=(400_000_000,), dtype="f4")
        else:  # hdf5-cycle: every nested "layers" group links back to the root, twice
            nested = handle["layers"]
            for name in ("a", "b"):
                nested[name] = handle
    assert path.stat().st_size < 100_000
    return path


ALLOCATION_BOMBS = ["bytearray", "declared-length", "tensor-constructor", "numpy-shape", "numpy-itemsize",
                    "storage-size", "hdf5-fill-bomb"]
SPECIAL_FILES = ["fifo", "dev-zero", "dev-urandom"]


@pytest.fixture(scope="module")
def limited(tmp_path_factory) -> dict[str, h.Limited]:
    folder = tmp_path_factory.mktemp("limited")
    cases = {"graph": ("ckpt", "inspect", _graph_file(folder), "--json", folder / "graph.json"),
             "zip-bomb": ("ckpt", "inspect", _zip_bomb(folder))}
    for bomb in ALLOCATION_BOMBS:
        path = _hdf5_file(folder, bomb) if bomb.startswith("hdf5") else _allocation_bomb(folder, bomb)
        cases[bomb] = ("ckpt", "inspect", path)
    cases["hdf5-cycle"] = ("ckpt", "inspect", _hdf5_file(folder, "hdf5-cycle"), "--json", folder / "cycle.json")
    for special in SPECIAL_FILES:
        cases[special] = ("ckpt", "inspect", _special_file(folder, special))
    return dict(zip(cases, h.run_limited(list(cases.values()), cwd=folder)))


def test_shared_reference_graph_is_walked_once(limited):
    result = limited["graph"]
    assert result.code == 0, result.err
    assert result.seconds < h.TIME_LIMIT_S
    entries = result.json["extra"]["checkpoint"]["other_entries"]
    assert "further references" in entries["(shared references)"]
    assert len(entries) < 100


def test_hdf5_link_cycles_are_walked_once(limited):
    result = limited["hdf5-cycle"]
    assert result.code == 0, result.err
    assert result.seconds < h.TIME_LIMIT_S
    assert result.json["extra"]["checkpoint"]["state_dicts"][0]["tensors"] == 1


def test_realistic_zip_bomb_is_refused(limited):
    result = limited["zip-bomb"]
    assert result.code == 2, result.err
    assert "inflate" in result.err and result.err.count("\n") == 1
    assert result.seconds < h.TIME_LIMIT_S


def test_zip_bomb_against_a_lowered_limit(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("NNDOCTOR_MAX_INFLATE_MB", "1")
    stream, crc, size = h.deflate_repeated(pickle.dumps({"w": 1}, protocol=2)[:-1], 8 << 20)
    path = tmp_path / "bomb.pt"
    h.write_zip(path, [("archive/data.pkl", stream, crc, size, True), h.stored("archive/version", b"3\n")])
    code, _out, err, _ = run_cli(capsys, "ckpt", "inspect", path)
    assert code == 2 and "NNDOCTOR_MAX_INFLATE_MB" in err


@pytest.mark.parametrize("bomb", ALLOCATION_BOMBS)
def test_allocation_bombs_in_safe_names_are_refused(limited, bomb):
    result = limited[bomb]
    assert result.code == 2, result.err
    assert result.err.startswith("nndoctor: error: ") and result.err.count("\n") == 1
    assert any(word in result.err for word in ("refusing", "declares", "truncated"))
    assert "MemoryError" not in result.err
    assert result.seconds < h.TIME_LIMIT_S


def test_codec_names_chosen_by_the_file_are_refused(tmp_path, capsys):
    path = tmp_path / "codec.pt"
    path.write_bytes(h.dump(h.Call(h.Global("_codecs", "encode"), ("x", "idna")), 2))
    code, _out, err, _ = run_cli(capsys, "ckpt", "inspect", path)
    assert code == 2 and "codec" in err


# -- 8. special files ----------------------------------------------------------------------
@pytest.mark.parametrize("special", SPECIAL_FILES)
def test_special_files_are_refused_not_read(limited, special):
    result = limited[special]
    assert result.code == 2 and "not a regular file" in result.err
    assert result.seconds < h.TIME_LIMIT_S


# -- 4. terminal escapes ---------------------------------------------------------------------
HOSTILE_TEXT = "\x1b]0;owned\x07\x1b[2J\x1b[31mred\rback\x08\x9b1m"


def test_escape_sequences_in_keys_and_metadata_are_shown_escaped(tmp_path, capsys):
    from safetensors.torch import save_file

    path = tmp_path / "weights.safetensors"
    save_file({HOSTILE_TEXT + ".weight": torch.ones(2)}, str(path), metadata={"note": HOSTILE_TEXT})
    code, out, err, report = run_cli(capsys, "ckpt", "inspect", path, "--json", tmp_path / "r.json")
    assert code == 0, err
    h.assert_no_raw_controls(out + err)
    assert "\\e]0;owned\\x07" in out
    # JSON keeps the raw value.
    keys = report["extra"]["checkpoint"]["state_dicts"][0]["keys"]
    assert HOSTILE_TEXT + ".weight" in keys
    assert report["extra"]["checkpoint"]["metadata"]["note"] == HOSTILE_TEXT


def test_escape_sequences_in_pickled_entries_are_shown_escaped(tmp_path, capsys):
    path = tmp_path / "ckpt.pt"
    torch.save({"model": {"w": torch.ones(1)}, HOSTILE_TEXT: HOSTILE_TEXT, "epoch": 1}, path)
    code, out, err, _report = run_cli(capsys, "ckpt", "inspect", path)
    assert code == 0, err
    h.assert_no_raw_controls(out + err)


def test_escape_sequences_in_the_file_name_are_shown_escaped(tmp_path, capsys):
    path = tmp_path / "m\x1b[2Jx.pt"
    torch.save({"w": torch.ones(1)}, path)
    code, out, _err, _ = run_cli(capsys, "ckpt", "inspect", path)
    assert code == 0
    header = out.splitlines()[0]  # the ckpt view; the findings block is report/terminal.py's
    h.assert_no_raw_controls(header)
    assert "\\e[2J" in header


def test_escape_sequences_in_an_error_message_are_shown_escaped(tmp_path, capsys):
    path = tmp_path / "bad\x1b]0;owned\x07.pt"
    path.write_bytes(b"this is not a checkpoint")
    code, out, err, _ = run_cli(capsys, "ckpt", "inspect", path)
    assert code == 2 and err.startswith("nndoctor: error: ")
    h.assert_no_raw_controls(out + err)


# -- 12. output paths ----------------------------------------------------------------------
@pytest.mark.parametrize("target", ["existing-dir", "unwritable-folder", "sysfs", "below-a-file"])
def test_fix_output_problems_are_one_line_errors(tmp_path, capsys, target):
    path = tmp_path / "in.pt"
    torch.save({"module.w": torch.ones(1)}, path)
    if target == "existing-dir":
        out = tmp_path / "out.pt"
        out.mkdir()
    elif target == "unwritable-folder":
        if os.geteuid() == 0:
            pytest.skip("root writes anywhere")
        folder = tmp_path / "ro"
        folder.mkdir(mode=0o500)
        out = folder / "out.pt"
    elif target == "sysfs":
        out = Path("/sys/nndoctor-out.pt")  # not writable, even for root
    else:
        (tmp_path / "afile").write_text("x")
        out = tmp_path / "afile" / "out.pt"
    code, out_text, err, _ = run_cli(capsys, "ckpt", "fix", path, "-o", out)
    assert code == 2, err
    assert err.startswith("nndoctor: error: ") and err.count("\n") == 1
    assert "Traceback" not in out_text + err


@pytest.mark.parametrize("target", ["directory", "below-a-file"])
def test_ckpt_json_output_problems_are_one_line_errors(tmp_path, capsys, target):
    path = tmp_path / "in.pt"
    torch.save({"w": torch.ones(1)}, path)
    (tmp_path / "afile").write_text("x")
    json_path = tmp_path if target == "directory" else tmp_path / "afile" / "r.json"
    code, out, err, _ = run_cli(capsys, "ckpt", "inspect", path, "--json", json_path)
    assert code == 2, err
    assert err.startswith("nndoctor: error: ") and err.count("\n") == 1
    assert "Traceback" not in out + err
