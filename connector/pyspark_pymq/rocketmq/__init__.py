"""The Apache RocketMQ backend: real RocketMQ 5.x brokers, spoken to over RocketMQ's
remoting protocol in pure Python.

:mod:`.codec` holds RocketMQ's own record layout (``MessageDecoder``): the
stored messages a pull answers with, decoded into ``MessageExt`` objects or
straight into the source's Arrow rows, and the body of a batch send.
"""

__all__: list[str] = []
