"""The generated gRPC code matches proto/pymq_proto/v1/pymq.proto (make proto); pymq_proto.wire."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from pymq_proto.v1 import pymq_pb2

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ["pymq_pb2.py", "pymq_pb2.pyi", "pymq_pb2_grpc.py", "pymq_pb2_grpc.pyi"]


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", str(ROOT / "proto"),
         f"--python_out={tmp_path}", f"--grpc_python_out={tmp_path}", f"--mypy_out={tmp_path}",
         f"--mypy_grpc_out={tmp_path}", str(ROOT / "proto/pymq_proto/v1/pymq.proto")],
        check=True, env=env, capture_output=True,
    )
    for name in GENERATED:
        fresh = (tmp_path / "pymq_proto/v1" / name).read_text()
        committed = (ROOT / "proto/pymq_proto/v1" / name).read_text()
        assert fresh == committed, f"{name} is stale: run `make proto` and commit the result"


@pytest.mark.parametrize("n_records,record_size", [(0, 0), (1, 120), (3, 200), (1000, 328), (200, 70_000)])
def test_encode_send_request_is_what_protobuf_serializes(n_records: int, record_size: int) -> None:
    """The hand-written `encoded` field gives the very bytes of SerializeToString (varints of 1-3 bytes)."""
    from pymq_proto.wire import SerializedRequest, encode_send_request, serialize_request

    records = bytes(range(256)) * (n_records * record_size // 256) + b"r" * (n_records * record_size % 256)
    sizes = struct.pack(f"<{n_records}i", *([record_size] * n_records))
    fields = dict(producer_group="PYMQ_SPARK_SINK", topic="orders", queue_id=3,
                  born_timestamp=1_700_000_000_000, batch=n_records > 1, reconsume_times=2)
    expected = pymq_pb2.SendMessageRequest(**fields)
    expected.encoded.records = records
    expected.encoded.sizes = sizes
    wire = encode_send_request(pymq_pb2.SendMessageRequest(**fields), records, sizes)
    assert isinstance(wire, SerializedRequest)
    assert serialize_request(wire) == expected.SerializeToString()
    parsed = pymq_pb2.SendMessageRequest.FromString(wire.wire)
    assert parsed.HasField("encoded") and parsed.encoded.records == records and parsed.encoded.sizes == sizes
    assert serialize_request(expected) == expected.SerializeToString()
    with pytest.raises(ValueError, match="already carries"):
        encode_send_request(expected, records, sizes)
