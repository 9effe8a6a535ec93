"""Reading tracebacks out of logs: frames, chained exceptions, worker tracebacks, bare lines."""

from __future__ import annotations

from nndoctor.commands.explain.frames import worker_traceback_frames
from nndoctor.commands.explain.tracetext import bare_error, parse_crashes

LOG = '''epoch 1 step 10 loss 2.31
Traceback (most recent call last):
  File "/home/me/proj/train.py", line 40, in <module>
    main()
  File "/home/me/proj/train.py", line 31, in main
    loss = criterion(out, y)
  File "/usr/lib/python3.10/site-packages/torch/nn/modules/loss.py", line 1174, in forward
    return F.cross_entropy(input, target)
IndexError: Target 10 is out of bounds.
epoch 1 done
'''


def test_frames_type_message_and_user_location():
    (chain,) = parse_crashes(LOG)
    (crash,) = chain
    assert crash.exc_type == "IndexError"
    assert crash.message.splitlines()[0] == "Target 10 is out of bounds."
    assert [f.line for f in crash.frames] == [40, 31, 1174]
    assert crash.frames[1].source == "loss = criterion(out, y)"
    assert str(crash.location) == "/home/me/proj/train.py:31"


def test_chained_tracebacks_are_one_crash_and_keep_the_cause():
    text = LOG.replace("epoch 1 done\n", "") + (
        "\nThe above exception was the direct cause of the following exception:\n\n"
        "Traceback (most recent call last):\n"
        '  File "/home/me/proj/run.py", line 3, in <module>\n'
        "    raise RuntimeError('training failed')\n"
        "RuntimeError: training failed\n")
    (chain,) = parse_crashes(text)
    assert [c.exc_type for c in chain] == ["IndexError", "RuntimeError"]
    assert "Target 10 is out of bounds" in chain[1].text


def test_separate_crashes_and_indented_logs():
    indented = "\n".join("[rank1]: " + line if line else line for line in LOG.splitlines())
    chains = parse_crashes(LOG + "\n" + LOG.replace("Target 10", "Target 11"))
    assert [c[0].message.split()[1] for c in chains] == ["10", "11"]
    (ranked,) = parse_crashes(indented)
    assert ranked[0].exc_type == "IndexError" and ranked[0].frames[1].line == 31


def test_worker_traceback_frames_from_message():
    message = ('Caught RuntimeError in DataLoader worker process 0.\n'
               'Original Traceback (most recent call last):\n'
               '  File "/x/site-packages/torch/utils/data/_utils/worker.py", line 358, in _worker_loop\n'
               '    data = fetcher.fetch(index)\n'
               '  File "/home/me/ds.py", line 11, in __getitem__\n'
               '    return img.cuda()\n'
               'RuntimeError: Cannot re-initialize CUDA in forked subprocess.')
    frames = worker_traceback_frames(message)
    assert [(f.path, f.line, f.function) for f in frames][-1] == ("/home/me/ds.py", 11, "__getitem__")
    assert frames[-1].is_user and not frames[0].is_user


def test_bare_error_line_without_traceback():
    crash = bare_error("blah\nRuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    assert crash.exc_type == "RuntimeError" and crash.message.startswith("CUDA out of memory")
    assert parse_crashes("no errors here, loss 0.1\n") == []
