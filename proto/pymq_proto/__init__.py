"""The pymq wire protocol: gRPC service definitions and the stored record layout.

`pymq_proto.v1` holds the generated gRPC code (regenerate with `make proto`).
`pymq_proto.record` is the commit-log record layout shared by the broker, which
writes records, and the client, which decodes them from pull responses.
`pymq_proto.topics` names a consumer group's retry and dead-letter topics
(%RETRY%<group>, %DLQ%<group>), which both sides use; `pymq_proto.subscription` the
rule of tag expressions.
"""

import os as _os

# grpcio >= 1.81 with fork support on can crash a child of subprocess.Popen before it execs
# (epoll_wait: Bad file descriptor, grpc/grpc#43055): a notebook that runs a broker or a
# producer and then starts Spark's JVM hits it at random. pymq never uses gRPC across a
# fork (Spark's workers open their own channels), so it is off unless the user says otherwise.
# Every pymq module that loads grpc imports this package first.
_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
