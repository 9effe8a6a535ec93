"""``nndoctor data``: check an image dataset (folders, record files, object stores) or TFRecord files before training (F1xx, F2xx).

The pieces, each with one job:

- ``detect``   decides a file's format from its content (unsupported formats are a usage error);
- ``storage``  opens local files or fsspec URLs (s3://, gs://) for ranged reads;
- ``sources``  shard patterns (``{000..127}``) and split names of record files;
- ``layout``   finds the splits, class folders and files of the paths given (streaming walk);
- ``records`` / ``readers/``  HDF5, LMDB, WebDataset, Parquet, NumPy: units of work and their records;
- ``probe``    inspects one image file (structure, full decode, mode, size, EXIF, hashes, statistics);
- ``tfrecord`` reads one TFRecord file (framing CRCs, tf.train.Example schema, embedded images);
- ``cache``    remembers probe results across runs (SQLite, keyed by path, size and mtime);
- ``index``    the per-scan on-disk table that cross-file checks query, so memory stays bounded;
- ``scan``     runs the probes over a process pool (or Ray: ``ray_engine``) and feeds the index;
- ``analyze`` / ``tfrecord_analyze``  turn the index into findings;
- ``checks``   the catalog entries and documentation of F101–F113 and F201–F203;
- ``cli``      the command line.
"""
