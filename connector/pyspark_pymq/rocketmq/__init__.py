"""The Apache RocketMQ backend: real RocketMQ 5.x brokers, spoken to over RocketMQ's
remoting protocol in pure Python.

:mod:`.codec` holds RocketMQ's own record layout (``MessageDecoder``): the
stored messages a pull answers with, decoded into ``MessageExt`` objects or
straight into the source's Arrow rows, and the body of a batch send.
:mod:`pyspark_pymq.rocketmq.transaction` is ``TransactionProducer(namesrv_addr=...)``: half messages,
END_TRANSACTION, and the brokers' check-backs answered on the producer's connections.
"""

__all__: list[str] = []
