"""Message sizes: every dtype string torch writes maps to its element size, and collective sizes are the whole
buffer (nccl-tests' convention)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from ddpdoctor.metrics.comm import _numel, bus_factor, dtype_bytes

ALL_DTYPES = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)


def _scalar_type_name(dtype: torch.dtype) -> str | None:
    """c10::toString(ScalarType) of ``dtype`` (what record_param_comms writes as ``dtype``), read from the
    "not implemented for 'Name'" error of an op the dtype lacks."""
    t = torch.empty((2,), dtype=dtype)
    for op in (torch.bitwise_not, torch.histc, torch.sum, torch.abs, torch.cumsum):
        try:
            op(t) if op is not torch.cumsum else op(t, 0)
        except Exception as exc:  # noqa: BLE001 - any error naming the dtype will do
            m = re.search(r"not implemented for '([^']+)'", str(exc))
            if m:
                return m.group(1)
    return None


def test_input_type_of_every_torch_dtype(tmp_path: Path) -> None:
    """The ``Input type`` strings a real profile writes for each dtype of the installed torch."""
    made = []
    with torch.profiler.profile(record_shapes=True) as prof:
        for dtype in ALL_DTYPES:
            try:
                t = torch.empty((3,), dtype=dtype)
            except (RuntimeError, TypeError):
                continue
            with torch.profiler.record_function(f"dtype={dtype}"):
                torch.ops.aten.alias(t)
            made.append(dtype)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    written = {}
    ranges = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events if e.get("name", "").startswith("dtype="))
    for e in events:
        if e.get("name") == "aten::alias":
            label = next(n for lo, hi, n in ranges if lo <= e["ts"] <= hi)
            written[label] = e["args"]["Input type"][0]
    assert len(made) >= 40  # every creatable dtype: float8s, complex, quantized, sub-byte ints
    wrong = {
        str(d): (written[f"dtype={d}"], dtype_bytes(written[f"dtype={d}"]), d.itemsize)
        for d in made
        if dtype_bytes(written[f"dtype={d}"]) != d.itemsize
    }
    assert not wrong
    # the two the issue found counted as 1 byte per 1024: torch writes them as C++ names
    assert written["dtype=torch.uint8"] == "unsigned char" and written["dtype=torch.int8"] == "signed char"


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_scalar_type_and_python_names(dtype: torch.dtype) -> None:
    name = _scalar_type_name(dtype) if dtype not in (torch.qint8, torch.quint8, torch.qint32) else None
    if name is not None:
        assert dtype_bytes(name) == dtype.itemsize, name
    assert dtype_bytes(str(dtype)) == dtype.itemsize  # "torch.float32"
    assert dtype_bytes(str(dtype).removeprefix("torch.")) == dtype.itemsize


def test_unknown_dtype_is_none_not_a_guess() -> None:
    assert dtype_bytes("TensorList") is None
    assert dtype_bytes("Scalar") is None
    assert dtype_bytes("") is None
    assert dtype_bytes(None) is None


def test_sizes_are_the_whole_buffer() -> None:
    # c10d::allgather_(Tensor[][] output_tensors, Tensor[] input_tensors, ...) over 4 ranks
    assert _numel([[[[1024], [1024], [1024], [1024]]], [[1024]], []]) == 4096
    # c10d::reduce_scatter_(Tensor[] output_tensors, Tensor[][] input_tensors, ...)
    assert _numel([[[256]], [[[256], [256], [256], [256]]], []]) == 1024
    # allreduce_ over one tensor; a plain tensor argument
    assert _numel([[[8, 128]], [], []]) == 1024
    assert _numel([[16, 4], []]) == 64
    assert _numel("not dims") == 0


def test_a_0_dim_tensor_is_one_element_and_an_argument_that_is_no_tensor_none() -> None:
    """A loss all-reduced for logging is a 0-dim tensor: its dims are ``[]``, as those of an argument that is no
    tensor. As recorded by torch 2.13 (CPU, gloo): ``c10d::allreduce_`` and the ``gloo:all_reduce`` annotation."""
    assert _numel([[[]], [], [], [], [], []], ["TensorList", "", "", "", "Scalar", "Scalar"]) == 1
    assert _numel([[]], ["float"]) == 1
    assert _numel([[]], ["Scalar"]) == 0  # no tensor
    assert _numel([[], []]) == 0  # types unknown: not sized
    assert _numel([[[]], [[]]], ["TensorList", "TensorList"]) == 1
    assert _numel([[[], []]], ["TensorList"]) == 2  # two 0-dim tensors in one list
    # nccl-tests' bus bandwidth factors
    assert bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bus_factor("all_gather", 8) == bus_factor("reduce_scatter", 8) == pytest.approx(0.875)
    assert bus_factor("broadcast", 8) == 1.0
