"""EmbeddedBroker: a broker in this process, for notebooks and tests."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
from pathlib import Path
from types import TracebackType

from .controller import BrokerController, build_configs


class EmbeddedBroker:
    """Runs a broker on a background thread of this process.

    Args:
        data_dir: where the store lives; None makes a temporary directory that
            is removed on :meth:`stop`. One broker per data dir: :meth:`start` raises
            :class:`~pymq_broker.store.store_lock.DataDirInUseError` while another broker (a
            ``pymq-broker`` process or an EmbeddedBroker) runs on it.
        port: 0 picks a free port. ``host`` defaults to 127.0.0.1.
        **config: any BrokerConfig or MessageStoreConfig field, e.g.
            ``flush_disk_type="SYNC_FLUSH"``, ``auto_create_topic_enable=True``,
            ``message_delay_level="1s 2s 5s"``, ``file_reserved_time=1.0``; security:
            ``authentication_enabled=True, authorization_enabled=True,
            init_authentication_user="admin:PASSWORD"``, ``tls_cert_file=``,
            ``tls_key_file=``, ``tls_client_ca_file=`` (see the README's Security).

    Example::

        with EmbeddedBroker() as broker:
            Admin(broker.endpoint).create_topic("orders")
    """

    def __init__(
        self, data_dir: str | Path | None = None, port: int = 0, host: str = "127.0.0.1",
        **config: object,
    ) -> None:
        self._temp = data_dir is None
        self.data_dir = Path(tempfile.mkdtemp(prefix="pymq-")) if data_dir is None else Path(data_dir)
        broker_config, store_config = build_configs(self.data_dir, port=port, host=host, **config)
        self.controller = BrokerController(broker_config, store_config)
        self.endpoint = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> EmbeddedBroker:
        ready = threading.Event()
        error: list[BaseException] = []
        loop = asyncio.new_event_loop()
        self._loop = loop

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                self.endpoint = loop.run_until_complete(self.controller.start())
            except BaseException as err:
                error.append(err)
                ready.set()
                return
            ready.set()
            loop.run_forever()

        self._thread = threading.Thread(target=run, name="pymq-embedded-broker", daemon=True)
        self._thread.start()
        ready.wait()
        if error:
            # the controller released the data dir and the port: this broker may be started again,
            # or another one on the same data dir
            self._thread.join(30)
            loop.close()
            self._loop = self._thread = None
            if self._temp:
                shutil.rmtree(self.data_dir, ignore_errors=True)
            raise error[0]
        return self

    def stop(self) -> None:
        """Shut down cleanly (everything flushed); removes a temporary data dir."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        fut = asyncio.run_coroutine_threadsafe(self.controller.shutdown(), loop)
        fut.result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()
        self._loop = self._thread = None
        if self._temp:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
