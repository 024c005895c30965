"""Generate (or check) the Python code of apache.rocketmq.v2 from ``proto-sources/``: ``make proto``.

Runs protoc (grpcio-tools, a dev dependency) on the published protos, then
rewrites the output so that it lives in this package: ``apache.rocketmq.v2``
module paths become ``pymq_proto.rocketmq_v2`` ones, and the descriptors go to
the package's private pool (see :mod:`pymq_proto.rocketmq_v2`). gRPC method
paths (``/apache.rocketmq.v2.MessagingService/...``) are left as they are.

``python -m pymq_proto.rocketmq_v2.generate`` writes the files;
``--check`` only says which ones differ (tests/test_proto.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTOS = HERE / "proto-sources"  # not a package name: setuptools keeps it as data
SOURCES = ["apache/rocketmq/v2/definition.proto", "apache/rocketmq/v2/service.proto"]
GENERATED = [
    "definition_pb2.py", "definition_pb2.pyi",
    "service_pb2.py", "service_pb2.pyi", "service_pb2_grpc.py", "service_pb2_grpc.pyi",
]
_REWRITES = [
    ("from google.protobuf import descriptor_pool as _descriptor_pool",
     "from pymq_proto.rocketmq_v2 import _pool as _descriptor_pool"),
    ("from apache.rocketmq.v2 import", "from pymq_proto.rocketmq_v2 import"),
    ("apache.rocketmq.v2.definition_pb2", "pymq_proto.rocketmq_v2.definition_pb2"),
    ("apache.rocketmq.v2.service_pb2", "pymq_proto.rocketmq_v2.service_pb2"),
]


def rewrite(text: str) -> str:
    """protoc's output for ``apache/rocketmq/v2`` as a module of this package."""
    for old, new in _REWRITES:
        text = text.replace(old, new)
    return text


def generate() -> dict[str, str]:
    """File name -> contents of the generated code, as it belongs in this package."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "grpc_tools.protoc", "-I", str(PROTOS),
             f"--python_out={tmp}", f"--grpc_python_out={tmp}", f"--mypy_out={tmp}",
             f"--mypy_grpc_out={tmp}", *(str(PROTOS / s) for s in SOURCES)],
            check=True, env=env, capture_output=True,
        )
        out = Path(tmp) / "apache/rocketmq/v2"
        return {name: rewrite((out / name).read_text()) for name in GENERATED}


def stale_files() -> list[str]:
    """The generated files that differ from what :func:`generate` makes now."""
    fresh = generate()
    return [name for name, text in fresh.items()
            if not (HERE / name).exists() or (HERE / name).read_text() != text]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--check"]:
        stale = stale_files()
        if stale:
            print(f"stale: {', '.join(stale)}; run `make proto`")
        return 1 if stale else 0
    for name, text in generate().items():
        (HERE / name).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
