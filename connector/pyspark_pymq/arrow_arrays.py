"""Arrow arrays from numpy and back, and Arrow scalars, made from buffers.

pyarrow's ``pa.array``, ``pa.scalar``, ``Array.to_numpy`` and compute functions given Python
values first ask whether their argument is a pandas object, and that question imports pandas
(~0.2-0.35 s of CPU and ~42 MiB resident, once per process). Spark's Python workers do not
import pandas to read a Python data source's Arrow batches (pyspark's own write path does, for
the commit message of each write task), so without these helpers every worker of a stream or a
batch read paid for pandas, unused. What the decoders and encoders need is fixed-width arrays,
so they are built from and read as their buffers here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

__all__ = [
    "INT32_ZERO", "binaries", "binary_scalar", "booleans", "from_numpy", "indices_of", "null_scalar",
    "string_scalar", "strings", "to_numpy",
]


def _dtype(type_: pa.DataType) -> np.dtype[np.generic]:
    if pa.types.is_unsigned_integer(type_):
        return np.dtype(f"<u{type_.bit_width // 8}")
    if pa.types.is_integer(type_) or pa.types.is_timestamp(type_) or pa.types.is_date64(type_):
        return np.dtype(f"<i{type_.bit_width // 8}")
    raise TypeError(f"arrow_arrays: {type_} is not a fixed-width integer or timestamp type")


def from_numpy(values: np.ndarray, type_: pa.DataType | None = None,
               mask: np.ndarray | None = None) -> pa.Array:
    """``values`` as an Arrow array of ``type_`` (an integer or timestamp type; default int64),
    null where ``mask`` is True (as ``pa.array(values, type_, mask=mask)``)."""
    type_ = pa.int64() if type_ is None else type_
    data = np.ascontiguousarray(values, dtype=_dtype(type_))
    n = len(data)
    validity = None
    nulls = 0
    if mask is not None:
        nulls = int(np.count_nonzero(mask))
        if nulls:
            validity = pa.py_buffer(np.packbits(~np.asarray(mask, dtype=bool), bitorder="little"))
    return pa.Array.from_buffers(type_, n, [validity, pa.py_buffer(data)], null_count=nulls)


def booleans(values: np.ndarray) -> pa.Array:
    """A numpy boolean array as an Arrow one, none null (as ``pa.array(values)``)."""
    flags = np.asarray(values, dtype=bool)
    return pa.Array.from_buffers(pa.bool_(), len(flags),
                                 [None, pa.py_buffer(np.packbits(flags, bitorder="little"))])


def to_numpy(arr: pa.Array) -> np.ndarray:
    """The values of an integer, timestamp or boolean array without nulls (as
    ``arr.to_numpy(zero_copy_only=False)``); a view of its buffer where the type allows."""
    if arr.null_count:
        raise ValueError(f"arrow_arrays.to_numpy: the array has {arr.null_count} null(s)")
    n, offset = len(arr), arr.offset
    data = arr.buffers()[1]
    if pa.types.is_boolean(arr.type):
        if n == 0:
            return np.zeros(0, dtype=bool)
        bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")
        return bits[offset:offset + n].astype(bool)
    dtype = _dtype(arr.type)
    if n == 0:
        return np.zeros(0, dtype=dtype)
    return np.frombuffer(data, dtype=dtype, count=n, offset=offset * dtype.itemsize)


def indices_of(mask: pa.Array) -> np.ndarray:
    """The positions where a boolean array is true (nulls count as false), as int64."""
    import pyarrow.compute as pc

    return to_numpy(pc.indices_nonzero(mask)).astype(np.int64)


def _values(type_: pa.DataType, raws: Sequence[bytes]) -> pa.Array:
    ends = np.cumsum(np.fromiter((len(r) for r in raws), dtype=np.int64, count=len(raws)))
    if len(ends) and int(ends[-1]) > np.iinfo(np.int32).max:
        raise ValueError(f"arrow_arrays: {int(ends[-1])} bytes do not fit a {type_} array (2 GiB at most)")
    offsets = np.zeros(len(raws) + 1, dtype=np.int32)
    offsets[1:] = ends
    data = pa.py_buffer(b"".join(raws))
    return pa.Array.from_buffers(type_, len(raws), [None, pa.py_buffer(offsets), data])


def strings(values: Sequence[str]) -> pa.Array:
    """``pa.array(values, pa.string())`` of a few strings (none null)."""
    return _values(pa.string(), [v.encode() for v in values])


def binaries(values: Sequence[bytes]) -> pa.Array:
    """``pa.array(values, pa.binary())`` (none null)."""
    return _values(pa.binary(), values)


def _one(type_: pa.DataType, raw: bytes) -> pa.Scalar:
    return _values(type_, [raw])[0]


def string_scalar(value: str) -> pa.Scalar:
    """``pa.scalar(value, pa.string())``."""
    return _one(pa.string(), value.encode())


def binary_scalar(value: bytes) -> pa.Scalar:
    """``pa.scalar(value, pa.binary())``."""
    return _one(pa.binary(), value)


def null_scalar(type_: pa.DataType) -> pa.Scalar:
    """``pa.scalar(None, type_)``."""
    return pa.nulls(1, type_)[0]


INT32_ZERO = from_numpy(np.zeros(1), pa.int32())[0]  # to compare with or fill in Arrow's int32 lengths
