"""apache.rocketmq.v2: the gRPC API of RocketMQ 5's official clients, as the embedded broker serves it.

The ``.proto`` files under ``proto-sources/`` are apache/rocketmq-apis release 2.1.2
(tag ``v2.1.2``, commit 68c2cc9442928f769f8938515a05af6fa05c9993), unchanged.
``definition_pb2``, ``service_pb2`` and ``service_pb2_grpc`` are generated from
them (``make proto``, i.e. ``python -m pymq_proto.rocketmq_v2.generate``) with
two rewrites: imports name this package, and the descriptors go to a private
pool (:mod:`pymq_proto.rocketmq_v2._pool`) instead of protobuf's default one.

Why the private pool: the official Python client (``rocketmq-python-client``)
registers its own copy of the same messages (file ``definition.proto``, package
``apache.rocketmq.v2``) in the default pool, and a process that loads both --
a notebook with an :class:`~pymq_broker.EmbeddedBroker` and a client, or a
test -- would otherwise fail with protobuf's duplicate symbol error. The wire
format is that of the published protos, which is all the clients see.
"""

PROTO_RELEASE = "v2.1.2"
