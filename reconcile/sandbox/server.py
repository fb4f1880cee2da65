"""Serve sandboxes on loopback in a background thread: :class:`SandboxServer` (one merchant)
and the machinery it shares with :class:`reconcile.sandbox.merchants.MerchantsServer`
(several merchants on one base URL): :class:`ServingBase`.

::

    with SandboxServer(api_key="snd_test", webhook_url=url, webhook_secret="whsec") as server:
        requests.post(f"{server.base_url}/payments", headers={"api-key": "snd_test"}, json=...)
        server.sandbox.flush_webhooks(5)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

from reconcile.sandbox.app import create_app
from reconcile.sandbox.clock import Clock
from reconcile.sandbox.state import Sandbox
from reconcile.sandbox.webhooks import HYPERSWITCH_RETRY_SCHEDULE

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIApplication

logger = logging.getLogger(__name__)


class _QuietHandler(WSGIRequestHandler):
    """Request lines go to this module's logger at DEBUG instead of stderr."""

    def log(self, type: str, message: str, *args: Any) -> None:
        logger.debug("%s %s", type, message % args, extra={"action": "sandbox_http"})


class _AccessLogHandler(WSGIRequestHandler):
    """Request lines go to this module's logger at INFO (used by ``python -m``)."""

    def log(self, type: str, message: str, *args: Any) -> None:
        logger.info("%s", message % args, extra={"action": "sandbox_http"})


class ServingBase:
    """Serves a WSGI app over :meth:`_sandboxes` on ``host:port`` in a background thread,
    starts and stops their webhook delivery, and ticks them every ``tick_interval`` seconds.

    Subclasses give the sandboxes and the app; :meth:`start`, :meth:`stop`, the context
    manager and :attr:`base_url` are shared.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        tick_interval: float | None = None,
        access_log: bool = False,
    ) -> None:
        self._host = host
        self._port = port
        self._tick_interval = tick_interval
        self._handler = _AccessLogHandler if access_log else _QuietHandler
        self._server: BaseWSGIServer | None = None
        self._threads: list[threading.Thread] = []
        self._ticker_stop = threading.Event()

    def _sandboxes(self) -> Sequence[Sandbox]:
        raise NotImplementedError

    def _wsgi_app(self) -> WSGIApplication:
        raise NotImplementedError

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>`` once started."""
        if self._server is None:
            raise RuntimeError("the sandbox server is not running")
        host = self._host if ":" not in self._host else f"[{self._host}]"
        return f"http://{host}:{self._server.port}"

    def start(self) -> Self:
        """Bind, start serving and start webhook delivery (idempotent)."""
        if self._server is not None:
            return self
        server = make_server(
            self._host,
            self._port,
            self._wsgi_app(),
            threaded=True,
            request_handler=self._handler,
        )
        self._server = server
        for sandbox in self._sandboxes():
            sandbox.public_url = self.base_url
            sandbox.start()
        self._ticker_stop.clear()
        serve = threading.Thread(
            target=server.serve_forever, name="sandbox-http", kwargs={"poll_interval": 0.05}
        )
        serve.daemon = True
        serve.start()
        self._threads = [serve]
        if self._tick_interval:
            ticker = threading.Thread(target=self._tick_loop, name="sandbox-tick", daemon=True)
            ticker.start()
            self._threads.append(ticker)
        logger.info(
            "sandbox processor listening",
            extra={
                "action": "sandbox_started",
                "base_url": self.base_url,
                "merchants": len(self._sandboxes()),
            },
        )
        return self

    def stop(self) -> None:
        """Stop serving, stop the webhook threads and close the socket (idempotent)."""
        server, self._server = self._server, None
        if server is None:
            return
        self._ticker_stop.set()
        for sandbox in self._sandboxes():
            sandbox.close()
        server.shutdown()
        server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads = []

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _tick_loop(self) -> None:
        interval = self._tick_interval or 1.0
        while not self._ticker_stop.wait(interval):
            for sandbox in self._sandboxes():
                sandbox.tick()


class SandboxServer(ServingBase):
    """A :class:`~reconcile.sandbox.state.Sandbox` served over HTTP on an ephemeral port.

    Use it as a context manager, or call :meth:`start` and :meth:`stop`. ``port=0`` picks a
    free port; :attr:`base_url` tells which. ``admin_api_key`` authenticates the events API
    (``None``: those routes answer 401). Other keyword arguments go to
    :class:`~reconcile.sandbox.state.Sandbox`. ``tick_interval`` (seconds) runs
    :meth:`Sandbox.tick` periodically so ``processing`` payments and pending refunds settle
    by themselves. Several merchants on one base URL:
    :class:`reconcile.sandbox.merchants.MerchantsServer`.
    """

    def __init__(
        self,
        api_key: str = "snd_sandbox_key",
        *,
        admin_api_key: str | None = None,
        webhook_url: str | None = None,
        webhook_secret: str | None = None,
        merchant_id: str = "merchant_sandbox",
        retry_schedule: Sequence[float] = HYPERSWITCH_RETRY_SCHEDULE,
        seed: int = 0,
        host: str = "127.0.0.1",
        port: int = 0,
        now: Clock | None = None,
        tick_interval: float | None = None,
        access_log: bool = False,
        **sandbox_options: Any,
    ) -> None:
        super().__init__(host=host, port=port, tick_interval=tick_interval, access_log=access_log)
        self._sandbox = Sandbox(
            api_key,
            admin_api_key=admin_api_key,
            webhook_url=webhook_url,
            webhook_secret=webhook_secret,
            merchant_id=merchant_id,
            retry_schedule=retry_schedule,
            seed=seed,
            now=now,
            **sandbox_options,
        )

    def __repr__(self) -> str:
        where = self.base_url if self._server is not None else "stopped"
        return f"SandboxServer({where}, merchant_id={self._sandbox.merchant_id!r})"

    @property
    def sandbox(self) -> Sandbox:
        """The state, webhook and fault controller behind the server."""
        return self._sandbox

    def _sandboxes(self) -> Sequence[Sandbox]:
        return (self._sandbox,)

    def _wsgi_app(self) -> WSGIApplication:
        return create_app(self._sandbox)
