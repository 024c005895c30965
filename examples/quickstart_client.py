"""Quickstart without Spark: an embedded broker, a producer and a pull consumer.

    python examples/quickstart_client.py
"""

from __future__ import annotations

from pymq_broker import EmbeddedBroker
from pyspark_pymq import Admin, Message, Producer, PullConsumer


def main() -> None:
    with EmbeddedBroker() as broker:
        admin = Admin(broker.endpoint)
        admin.create_topic("orders", queues=4)

        with Producer(broker.endpoint) as producer:
            result = producer.send(Message("orders", b'{"id": 1}', tags="created", keys=["order-1"]))
            print("sent", result.msg_id, "to", result.message_queue, "offset", result.queue_offset)
            producer.send_batch([Message("orders", f'{{"id": {i}}}', tags="created") for i in range(2, 101)])

        consumer = PullConsumer(broker.endpoint, "quickstart")
        for mq in consumer.queues("orders"):
            start = max(consumer.committed(mq), 0)
            pulled = consumer.pull(mq, start, max_nums=1000)
            print(mq, pulled.status.value, len(pulled.messages), "messages")
            consumer.commit(mq, pulled.next_begin_offset)

        print(admin.group_progress("quickstart").to_string(index=False))


if __name__ == "__main__":
    main()
