"""Topic routes: which MessageQueues a topic has, and which broker serves each.

Every identity is (topic, broker name, queue id) and every broker is reached at
the endpoint its route names, so a cluster of several brokers needs no change
here: the client starts from one endpoint and follows the routes it returns.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from pymq_proto.v1 import pymq_pb2

from ..errors import PymqError
from .message import MessageQueue
from .transport import BrokerClient

__all__ = ["PERM_READ", "PERM_WRITE", "RouteCache", "TopicRoute"]

PERM_READ = 4
PERM_WRITE = 2
_WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})
ROUTE_TTL_S = 30.0
# After a failed refresh the last route is served this long before asking again, so a
# broker that does not answer costs one timeout per interval, not one per send.
ROUTE_RETRY_AFTER_S = 2.0


@dataclass(frozen=True, slots=True)
class TopicRoute:
    topic: str
    publish_queues: tuple[MessageQueue, ...]
    subscribe_queues: tuple[MessageQueue, ...]
    endpoints: dict[str, str]  # broker name -> endpoint

    @staticmethod
    def from_proto(data: pymq_pb2.TopicRouteData) -> TopicRoute:
        endpoints = {b.broker_name: b.endpoint for b in data.brokers}
        pub: list[MessageQueue] = []
        sub: list[MessageQueue] = []
        for q in data.queues:
            if q.perm & PERM_WRITE:
                pub.extend(MessageQueue(data.topic, q.broker_name, i) for i in range(q.write_queue_nums))
            if q.perm & PERM_READ:
                sub.extend(MessageQueue(data.topic, q.broker_name, i) for i in range(q.read_queue_nums))
        return TopicRoute(data.topic, tuple(pub), tuple(sub), endpoints)


class RouteCache:
    """Routes by topic, refreshed after ROUTE_TTL_S.

    As RocketMQ's client keeps its last topic route when the name server does
    not answer, a refresh that fails with a transient error (a retriable one:
    the broker is unreachable, slow or busy) keeps serving the route it had,
    and asks again only after ROUTE_RETRY_AFTER_S: a send can then still be
    retried, and fault avoidance decides where it goes.
    """

    def __init__(self, bootstrap: BrokerClient) -> None:
        self.bootstrap = bootstrap
        self._routes: dict[str, tuple[float, TopicRoute]] = {}
        self._clients: dict[str, BrokerClient] = {}
        self._lock = threading.Lock()

    def get(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        now = time.monotonic()
        hit = self._routes.get(topic)
        if hit is not None and not refresh and now - hit[0] < ROUTE_TTL_S:
            return hit[1]
        try:
            data = self.bootstrap.query_route(pymq_pb2.QueryRouteRequest(topic=topic))
        except PymqError as err:
            if hit is None or not err.retriable:
                raise
            with self._lock:
                self._routes[topic] = (time.monotonic() - ROUTE_TTL_S + ROUTE_RETRY_AFTER_S, hit[1])
            return hit[1]
        route = TopicRoute.from_proto(data)
        with self._lock:
            self._routes[topic] = (now, route)
        return route

    def client(self, topic: str, broker_name: str) -> BrokerClient:
        """The client of the broker that serves ``broker_name`` for ``topic``."""
        cached = self._clients.get(broker_name)
        if cached is not None:
            return cached
        endpoint = self.get(topic).endpoints.get(broker_name, self.bootstrap.endpoint)
        if endpoint.rpartition(":")[0].strip("[]") in _WILDCARD_HOSTS:
            # a broker bound to every interface (--host 0.0.0.0) names no address a client can
            # reach (nor one its TLS certificate holds): the one this client came by reaches it
            endpoint = self.bootstrap.endpoint
        client = (
            self.bootstrap
            if endpoint == self.bootstrap.endpoint
            else self.bootstrap.sibling(endpoint)
        )
        with self._lock:
            self._clients[broker_name] = client
        return client
