"""What an authorization decision reads from the broker's state: the topic of a record a send
back names by commit-log offset, the producer group of a pending transaction, and whether a
topic exists (creating it needs Create, changing it Update).

Without these a consumer allowed on its own group could send back (copy into its
``%RETRY%``) a message of a topic it may not read, or end another group's transaction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pymq_proto.record import HEADER, split_tail

if TYPE_CHECKING:
    from ..controller import BrokerController


class StoredRecords:
    """Reads records of the controller's store (built before the store opens; used after)."""

    def __init__(self, controller: BrokerController) -> None:
        self.controller = controller

    def _records(self, offsets: list[int]) -> list[bytes | None]:
        store = self.controller.store
        return [] if store is None else store.look_messages_by_offsets(offsets)

    def topic_exists(self, topic: str) -> bool:
        return topic in self.controller.topic_config_manager.topic_config_table

    def topics_at(self, offsets: list[int]) -> dict[int, str]:
        """The topic of the record at each of ``offsets`` (an offset with no record is left out)."""
        topics = {}
        for offset, rec in zip(offsets, self._records(offsets), strict=True):
            if rec is not None:
                h = HEADER.unpack_from(rec)
                t0, t1, _p0, _p1 = split_tail(rec, 0, h[0], h[13])
                topics[offset] = bytes(rec[t0:t1]).decode("utf-8", "replace")
        return topics

    def transaction_owners(self, msg_ids: list[str]) -> dict[str, str]:
        """The producer group (PGROUP) of each pending transaction among ``msg_ids``."""
        return self.controller.transactions.owners(msg_ids)
