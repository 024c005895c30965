"""The descriptor pool of apache.rocketmq.v2 in this package, apart from protobuf's default one.

The generated modules call :func:`Default` where protoc's code calls
``descriptor_pool.Default()``, so the official client's own copy of these
messages in the default pool cannot clash with this one (see the package's
docstring). The well-known types the protos import are added first.
"""

from __future__ import annotations

from google.protobuf import descriptor_pool, duration_pb2, timestamp_pb2

_POOL = descriptor_pool.DescriptorPool()
for _dependency in (timestamp_pb2, duration_pb2):
    _POOL.AddSerializedFile(_dependency.DESCRIPTOR.serialized_pb)


def Default() -> descriptor_pool.DescriptorPool:
    """This package's pool (named as the function the generated code calls)."""
    return _POOL
