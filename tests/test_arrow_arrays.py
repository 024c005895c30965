"""Arrow arrays made from buffers (pyspark_pymq.arrow_arrays), and Spark's Python workers that read
kept free of pandas: pyarrow's pa.array / pa.scalar / to_numpy import it (~42 MiB, ~0.2-0.35 s a
process), which neither Spark's read path nor pymq's decoders and encoders use."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark_pymq.arrow_arrays import (
    binaries,
    binary_scalar,
    booleans,
    from_numpy,
    indices_of,
    null_scalar,
    string_scalar,
    strings,
    to_numpy,
)

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("type_", [pa.int32(), pa.int64(), pa.timestamp("us", tz="UTC")])
def test_from_numpy_is_pa_array(type_: pa.DataType) -> None:
    values = np.array([3, -1, 0, 2**20, 7], dtype=">i8")  # big-endian, as RocketMQ's headers
    mask = np.array([False, True, False, False, True])
    assert from_numpy(values, type_).equals(pa.array(values.astype(np.int64), type_))
    got = from_numpy(values, type_, mask=mask)
    assert got.equals(pa.array(values.astype(np.int64), type_, mask=mask)) and got.null_count == 2
    assert from_numpy(values, type_, mask=np.zeros(5, dtype=bool)).null_count == 0
    assert from_numpy(np.zeros(0), type_).equals(pa.array([], type_))


def test_to_numpy_reads_slices_of_ints_and_booleans() -> None:
    ints = pa.array(list(range(20)), pa.int32()).slice(5, 9)
    assert to_numpy(ints).tolist() == list(range(5, 14))
    flags = pa.array([i % 3 == 0 for i in range(20)])
    assert to_numpy(flags.slice(3, 11)).tolist() == [i % 3 == 0 for i in range(3, 14)]
    assert to_numpy(pa.array([], pa.bool_())).tolist() == []
    assert indices_of(pc.equal(strings(["a", "b", "a", ""]), string_scalar("a"))).tolist() == [0, 2]
    with pytest.raises(ValueError, match="1 null"):
        to_numpy(pa.array([1, None], pa.int64()))
    with pytest.raises(TypeError, match="string"):
        from_numpy(np.zeros(2), pa.string())


def test_scalars_and_strings_are_pyarrows() -> None:
    assert string_scalar("KEYS").equals(pa.scalar("KEYS", pa.string()))
    assert string_scalar("").equals(pa.scalar("", pa.string()))
    assert binary_scalar(b"\x01x").equals(pa.scalar(b"\x01x", pa.binary()))
    assert null_scalar(pa.string()).equals(pa.scalar(None, pa.string()))
    assert strings(["é", "", "TagA"]).equals(pa.array(["é", "", "TagA"], pa.string()))
    assert strings([]).equals(pa.array([], pa.string()))
    assert binaries([b"\x00z", b"", b"\xff"]).equals(pa.array([b"\x00z", b"", b"\xff"], pa.binary()))
    flags = np.array([i % 3 == 0 for i in range(19)])
    assert booleans(flags).equals(pa.array(flags)) and booleans(flags[:0]).equals(pa.array([], pa.bool_()))


_WORKER = r"""
import sys
import pyarrow as pa

from pymq_proto.record import encode_record
from pyspark_pymq.backend.base import BackendConfig, filter_batch_by_tags
from pyspark_pymq.backend.pymq import PymqBackend
from pyspark_pymq.backend.pymq_arrow import decode_to_arrow
from pyspark_pymq.rocketmq import codec
from pyspark_pymq.spark.schema import project
from pyspark_pymq.spark.writer import encode_plain_batch
from test_rocketmq_codec import COMPRESSED, Rec, deflate, encode_stored

def record(offset, props):
    return encode_record(topic=b"%RETRY%g", queue_id=1, flag=0, body=b"body", properties=props,
                         queue_offset=offset, physical_offset=100 * offset, sys_flag=0, born_timestamp=1,
                         store_timestamp=2, store_host=bytes(8), reconsume_times=1)

# the read path: every column, tags, keys, msg ids, a retry topic's original topic, a tag filter
props = [b"UNIQ_KEY\x01A%d\x02KEYS\x01k1 k2\x02TAGS\x01t%d\x02RETRY_TOPIC\x01orders\x02" % (i, i % 2)
         for i in range(50)] + [b"TAGS\x01t0\x02KEYS\x01\x02" for _ in range(50)]
batch = decode_to_arrow(b"".join(record(i, p) for i, p in enumerate(props)), topic="%RETRY%g",
                        broker_name="broker-a", retry=True)
assert batch.num_rows == 100 and batch.column("topic")[0].as_py() == "orders"
assert filter_batch_by_tags(batch, ["t1"]).num_rows == 25
project(batch, ("body", "queue_offset"))
stored = b"".join(encode_stored(Rec(topic="t", queue_offset=i, properties={"TAGS": "a", "KEYS": "x y",
                                                                           "UNIQ_KEY": "U%d" % i}))
                  for i in range(10))
assert codec.decode_to_arrow(stored, topic="t", broker_name="broker-a", retry=False).num_rows == 10
# a body RocketMQ's producers compressed (over 4 KiB), a store host with an IPv6 address, an empty pull
big = b"x" * 5000
odd = [Rec(topic="t", queue_offset=0, body=big, sys_flag=COMPRESSED, stored_body=deflate(big)),
       Rec(topic="t", queue_offset=1, store_host=("::1", 10911)), Rec(topic="t", queue_offset=2)]
got = codec.decode_to_arrow(b"".join(encode_stored(r) for r in odd), topic="t", broker_name="b", retry=False)
assert got.column("body").to_pylist() == [big, b"body", b"body"]
assert [len(i) for i in got.column("offset_msg_id").to_pylist()] == [32, 56, 32]
assert codec.decode_to_arrow(b"", topic="t", broker_name="b", retry=False).num_rows == 0
# the sink's bulk path: a batch as Spark hands it over (Arrow IPC), with tags
with pa.ipc.open_stream(sys.stdin.buffer.read()) as reader:
    rows = reader.read_next_batch()
backend = PymqBackend(BackendConfig("127.0.0.1:1"))  # frames records, never connects
assert encode_plain_batch(rows, "t", "0123456789ABCDEF", 0, "here", 1000, b"", backend) is not None
codec.encode_batch_columns(rows.column(0), b"TAGS\x01a\x02")
print("pandas" in sys.modules)
"""


def test_decoding_pulls_and_encoding_sink_batches_never_imports_pandas(tmp_path: Path) -> None:
    rows = pa.RecordBatch.from_pydict({"body": pa.array([b"a", b"bc", b""]),
                                       "tags": pa.array(["x", None, ""])})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows.schema) as writer:
        writer.write_batch(rows)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(ROOT / d) for d in
                                                        ("connector", "proto", "broker_stub", "tests"))}
    out = subprocess.run([sys.executable, "-c", _WORKER], input=sink.getvalue().to_pybytes(),
                         capture_output=True, env=env, cwd=tmp_path, timeout=120, check=False)
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode().strip() == "False", "a worker's decoding or encoding imported pandas"
