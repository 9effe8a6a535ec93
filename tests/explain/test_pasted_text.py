"""Reading errors out of text as users paste it: prefixes, markdown, C++ terminate lines,
text before the exception's name, older PyTorch wordings, and linear time on long logs."""

from __future__ import annotations

import time

import pytest

from nndoctor.commands.explain.cli import explain_text
from nndoctor.commands.explain.pasted import clean_line
from nndoctor.commands.explain.tracetext import parse_crashes
from nndoctor.commands.explain.wordings import current_wording

TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "/home/me/proj/train.py", line 31, in main',
    "    loss = criterion(out, y)",
    "IndexError: Target 10 is out of bounds.",
]


@pytest.mark.parametrize("line, cleaned", [
    ("[rank3]: RuntimeError: x", "RuntimeError: x"),
    ("(RayTrainWorker pid=4411) RuntimeError: x", "RuntimeError: x"),
    ("(pid=4411, ip=10.0.0.2)   File \"a.py\", line 3, in f", '  File "a.py", line 3, in f'),
    ("2024-05-01T12:00:03.123Z   File \"a.py\", line 3, in f", '  File "a.py", line 3, in f'),
    ("[1,0]<stderr>:  File \"a.py\", line 3, in f", '  File "a.py", line 3, in f'),
    ("2023-01-02 10:11:12,345 - ERROR - RuntimeError: x", "RuntimeError: x"),
    ("[2023-01-02 10:11:12] [ERROR] RuntimeError: x", "RuntimeError: x"),
    ("ERROR:root:RuntimeError: x", "RuntimeError: x"),
    ("> > RuntimeError: x", "RuntimeError: x"),
    ("E           RuntimeError: x", "RuntimeError: x"),
    ("**RuntimeError: x**", "RuntimeError: x"),
    ("    **loss = f(**kwargs)**", "    loss = f(**kwargs)"),
    ("`RuntimeError: x`", "RuntimeError: x"),
    ("```RuntimeError: x```", "RuntimeError: x"),
    ("```python-traceback", ""),
    ("“RuntimeError: x", "RuntimeError: x"),
    ('    "a".join(parts)', '    "a".join(parts)'),  # source lines keep their quotes
    ("    result = self.forward(*input, **kwargs)", "    result = self.forward(*input, **kwargs)"),
])
def test_clean_line(line, cleaned):
    assert clean_line(line) == cleaned


def test_timestamp_on_every_line_keeps_frames_and_sources():
    log = "\n".join(f"2024-05-01T12:00:0{i}.000Z {line}" for i, line in enumerate(TRACEBACK))
    ((crash,),) = parse_crashes(log)
    assert crash.exc_type == "IndexError"
    assert [(f.line, f.source) for f in crash.frames] == [(31, "loss = criterion(out, y)")]


@pytest.mark.parametrize("text, code", [
    ("2023-01-02 10:11:12,345 - trainer - ERROR - RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB",
     "E108"),
    ("Training stopped; the actual error: RuntimeError: Expected all tensors to be on the same device, "
     "but found at least two devices, cuda:0 and cpu!", "E101"),
    ("UserWarning: this is only a warning\nIndexError: Target 5 is out of bounds.", "E117"),
])
def test_error_after_a_prefix_or_text_is_explained(text, code):
    findings, unexplained = explain_text(text)
    assert [f.code for f in findings] == [code] and not unexplained


def test_cpp_terminate_keeps_the_cpp_type_and_what_message():
    text = ("terminate called after throwing an instance of 'c10::CUDAError'\n"
            "  what():  CUDA error: an illegal memory access was encountered\n"
            "frame #0: c10::Error::Error(...) + 0x6b\n")
    ((crash,),) = parse_crashes(text)
    assert crash.exc_type == "c10::CUDAError"
    assert crash.message.startswith("CUDA error: an illegal memory access")
    findings, unexplained = explain_text(text)
    assert not findings and unexplained  # no catalog cause: said so, not guessed


def test_headerless_traceback_keeps_the_user_frame():
    text = "\n".join(TRACEBACK[1:])
    ((crash,),) = parse_crashes(text)
    assert str(crash.location) == "/home/me/proj/train.py:31"


def test_pytest_failure_location_is_the_user_frame():
    text = ("    def test_m2():\n>       run()\n"
            "E           RuntimeError: Expected all tensors to be on the same device, but found at least two "
            "devices, cuda:0 and cpu!\n\nbliss/catalog.py:178: RuntimeError\n")
    ((crash,),) = parse_crashes(text)
    assert str(crash.location) == "bliss/catalog.py:178"


def test_complete_traceback_survives_a_cut_one_after_it():
    text = "\n".join([*TRACEBACK, "", "Traceback (most recent call last):", '  File "/home/me/proj/train.py", line 9'])
    ((crash,),) = parse_crashes(text)
    assert crash.exc_type == "IndexError" and crash.frames[0].line == 31


def test_message_without_exception_name_above_a_cut_traceback():
    text = ("Expected object of device type cuda but got device type cpu for argument #1 'self' in call to _th_mm\n"
            "Traceback (most recent call last):\n"
            '  File "/home/me/proj/train.py", line 12, in <module>\n'
            "    out = model(x)\n")
    ((crash,),) = parse_crashes(text)
    assert crash.exc_type == "Error" and str(crash.location) == "/home/me/proj/train.py:12"
    assert [f.code for f in explain_text(text)[0]] == ["E101"]


def test_prose_without_an_error_is_not_an_error():
    assert parse_crashes("We saw a lot of Error handling here, see my.Error class.\nloss 0.3\n") == []


@pytest.mark.parametrize("old, code", [
    ("RuntimeError: Expected object of scalar type Long but got scalar type Float for argument #2 'target'", "E102"),
    ("RuntimeError: Expected object of type torch.cuda.FloatTensor but found type torch.FloatTensor for argument #2 "
     "'weight'", "E101"),
    ("RuntimeError: Expected object of type torch.LongTensor but found type torch.FloatTensor for argument #2 "
     "'target'", "E102"),
    ("RuntimeError: Expected object of backend CUDA but got backend CPU for argument #2 'mat2'", "E101"),
    ("RuntimeError: Tensor for argument #2 'mat1' is on CPU, but expected it to be on GPU (while checking arguments "
     "for addmm)", "E101"),
    ("RuntimeError: size mismatch, m1: [64 x 784], m2: [512 x 10] at /pytorch/aten/src/TH/generic/THTensorMath.cpp:752",
     "E105"),
    ("RuntimeError: cuda runtime error (2) : out of memory at /pytorch/aten/src/THC/THCCachingAllocator.cpp:510",
     "E108"),
    ("RuntimeError: Assertion `cur_target >= 0 && cur_target < n_classes' failed.  at "
     "/pytorch/aten/src/THNN/generic/ClassNLLCriterion.c:93", "E117"),
    ("RuntimeError: multi-target not supported at /pytorch/aten/src/THNN/generic/ClassNLLCriterion.c:21", "E124"),
    ("RuntimeError: bool value of Tensor with more than one value is ambiguous", "E125"),
    ("RuntimeError: Given groups=1, weight[64, 3, 7, 7], so expected input[16, 1, 224, 224] to have 3 channels, "
     "but got 1 channels instead", "E104"),
    ("RuntimeError: element 1 of tensors does not require grad and does not have a grad_fn", "E112"),
])
def test_older_pytorch_wordings_are_explained(old, code):
    findings, unexplained = explain_text(old)
    assert [f.code for f in findings] == [code] and not unexplained


def test_current_wordings_need_no_rewrite():
    assert current_wording("RuntimeError: expected scalar type Long but found Float") == []


@pytest.mark.parametrize("make_log", [
    lambda n: "[rank0]: **x = 1**  `y` > E   \n" * n,  # decorations on every line, no error
    lambda n: 'File "a.py", line 1, in f\n' * n + "RuntimeError: boom\n",  # one huge headerless traceback
    lambda n: "terminate called after throwing an instance of 'c10::Error'\n" * n,  # no what() line
    lambda n: "a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q.r.s.t.u.v.w.x.y.z: " * 20 + "\n" * n,  # dotted near-misses
])
def test_reading_a_long_pasted_log_stays_linear(make_log):
    def seconds(n: int) -> float:
        text = make_log(n)
        started = time.perf_counter()
        explain_text(text)
        return time.perf_counter() - started

    small, large = seconds(2_000), seconds(16_000)
    # Eight times the text: a linear reader takes ~8x; a quadratic one ~64x. Allow noise.
    assert large < max(small * 24, 0.5), (small, large)


def test_trimmed_stdlib_paths_are_not_user_code():
    from nndoctor.core.user_code import is_user_path

    assert not is_user_path("python3.8/threading.py")
    assert not is_user_path("/usr/lib/python3.10/runpy.py")
    assert is_user_path("/home/me/proj/train.py") and is_user_path("/home/me/python3/proj/train.py")


def test_older_wordings_give_the_same_facts_as_the_current_ones():
    (device,), _ = explain_text("RuntimeError: Expected object of backend CUDA but got backend CPU for argument #2 'mat2'")
    assert device.evidence["devices"] == ["cuda", "cpu"]
    (dtype,), _ = explain_text("RuntimeError: Expected object of scalar type Long but got scalar type Float for "
                               "argument #2 'target' in call to _thnn_nll_loss_forward")
    assert dtype.evidence == {"expected": "Long", "found": "Float"} and dtype.message.startswith("The target")
    (linear,), _ = explain_text("RuntimeError: size mismatch, m1: [1 x 56], m2: [48 x 64] at THTensorMath.cpp:136")
    assert "56" in linear.message and "48" in linear.message
    ((crash,),) = parse_crashes("RuntimeError: cuda runtime error (2) : out of memory at THCStorage.cu:58")
    assert crash.message.splitlines()[0] == "cuda runtime error (2) : out of memory at THCStorage.cu:58"
