"""The generated gRPC code matches proto/pymq_proto/v1/pymq.proto (regenerate: make proto)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
