"""``nndoctor ckpt``: inspect, diff, repair and convert checkpoints without running untrusted code.

Reading: reader.py (format sniffing, pickle_scan.py before any load, embedded.py for pickles
inside .npy/.npz/zip/tar/HDF5, safe_unpickle.py: the inert reader with allowlist.py and the
limits of nndoctor/util/limits.py), containers.py (state dicts inside containers). Fitting: mapping.py, prefixes.py.
Writing: writer.py. Keras: keras_weights.py (h5py only), keras_convert.py, keras_runtime.py.
Commands: inspect_cmd.py, diff_cmd.py, fix_cmd.py, convert_cmd.py; findings: analysis.py,
checks.py (C201–C210), shared_codes.py (C101/C103/C104).
"""
