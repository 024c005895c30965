"""The proxy layer: apache.rocketmq.v2, the gRPC API of RocketMQ 5's official clients.

RocketMQ 5 puts this API in front of its brokers as the *proxy*; pymq serves it
from the broker's own gRPC server, next to pymq's service, on the same store,
topics, groups, offsets, retry and DLQ. The layer is thin, as in RocketMQ:

- :mod:`~pymq_broker.proxy.grpc_messaging_service`: the servicer; a ``Status``
  on every answer, errors as rocketmq-apis' codes;
- :mod:`~pymq_broker.proxy.messaging_processor`: one method per RPC, on top of
  the broker's processors and managers;
- :mod:`~pymq_broker.proxy.message_converter`: v2 messages <-> stored records;
- :mod:`~pymq_broker.proxy.pop_message_manager`: receive / ack / change
  invisible duration (RocketMQ's pop) and redelivery;
- :mod:`~pymq_broker.proxy.pull_offset_processor`: PullMessage and the
  offset RPCs, which RocketMQ's proxy does not serve;
- :mod:`~pymq_broker.proxy.status`: status codes and errors;
- :mod:`~pymq_broker.proxy.proxy_config`: the layer's settings.
"""
