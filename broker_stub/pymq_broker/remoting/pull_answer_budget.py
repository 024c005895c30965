"""PullAnswerBudget: bytes of pull answers a connection has not taken yet, capped.

gRPC holds an answer in the broker's memory until the client's flow-control window
lets it out. A client that stops reading (a stopped process, a hostile one) while
its pulls keep being answered would make the broker hold every answer: ~16 MiB
pulls drove a broker to 1.7 GB. Each connection (gRPC peer) may have at most
``max_bytes`` of answers handed to gRPC and not delivered (an RPC is done once its
answer is written out, or it failed); past that its pulls are answered SYSTEM_BUSY,
which pymq's clients retry, until what it holds drains. RocketMQ bounds the same
with its pull thread pool's queue and answers its busy clients the same way.
"""

from __future__ import annotations

from pymq_proto.v1 import pymq_pb2

from ..common.broker_exception import BrokerException

DEFAULT_MAX_BYTES = 256 * 1024 * 1024


class PullAnswerBudget:
    """Per-peer bytes of pull answers not delivered yet (see the module)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self.held: dict[str, int] = {}
        self.refused = 0

    def check(self, peer: str) -> None:
        """SYSTEM_BUSY when ``peer`` holds ``max_bytes`` of answers it has not taken."""
        held = self.held.get(peer, 0)
        if held >= self.max_bytes:
            self.refused += 1
            raise BrokerException(
                pymq_pb2.SYSTEM_BUSY,
                f"this connection has {held} bytes of pull answers it has not read yet (limit "
                f"maxPullBytesInFlightPerClient {self.max_bytes}); read them before pulling more",
            )

    def hold(self, peer: str, size: int) -> None:
        self.held[peer] = self.held.get(peer, 0) + size

    def release(self, peer: str, size: int) -> None:
        left = self.held.get(peer, 0) - size
        if left > 0:
            self.held[peer] = left
        else:
            self.held.pop(peer, None)
