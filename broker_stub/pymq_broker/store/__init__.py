"""The message store: commit log, consume queues, index, flush, recovery, retention.

It knows nothing of gRPC: processors call :class:`DefaultMessageStore`.
"""
