"""Several merchant accounts on one sandbox base URL, as Hyperswitch serves them:
:class:`MerchantsApp` (the WSGI app) and :class:`MerchantsServer` (it, on loopback).

Each merchant is a :class:`~reconcile.sandbox.state.Sandbox` of its own: its API key, admin
key, merchant id, business profiles (each with its webhook URL and signing secret: see
:meth:`~reconcile.sandbox.state.Sandbox.add_profile`), objects, faults, rate limit and clock.
One :func:`~reconcile.sandbox.app.create_app` app is built per merchant, and every
request is handed to one of them:

- **API routes**: the ``api-key`` header picks the merchant whose API key it is, so the same
  ``payment_id`` may live in two merchants and each key sees only its own. A key that is no
  merchant's is answered by the first merchant's app, whose guard refuses it: 401 ``AU_01``,
  the same answer (body and headers) a single sandbox gives an unknown key.
- **Events API** (``/events/<merchant_id>/...``, admin key): the merchant id, or the id of
  one of its business profiles (those added later too), in the path picks the merchant,
  whose app checks *its* admin key. An id no merchant has goes
  to the merchant whose admin key the request carries (404 ``Merchant account`` not found, as
  a single sandbox answers another merchant's id), or, with no such key, is refused (401).
- **Sandbox admin routes** (no key): ``GET /__sandbox/merchants`` lists the merchants (ids
  and webhook URLs, never a key or a secret); ``/__sandbox/merchants/<merchant_id>/<route>``
  is that merchant's ``/__sandbox/<route>`` (faults, tick, clock, events, flush ...). The
  short ``/__sandbox/<route>`` is the merchant's when there is only one, else 404 naming the
  long form.

Merchant ids, profile ids and API keys must tell the merchants apart (a
:class:`~receiver.core.errors.ConfigurationError` otherwise; a profile added later under an id
another merchant uses is found in that merchant's first); admin keys may be shared, as
Hyperswitch's one admin key serves every merchant.

::

    eu = Sandbox("snd_eu_key", merchant_id="merchant_eu", profile_id="pro_eu", ...)
    us = Sandbox("snd_us_key", merchant_id="merchant_us", profile_id="pro_us", ...)
    with MerchantsServer([eu, us]) as server:
        requests.get(f"{server.base_url}/payments/pay_1", headers={"api-key": "snd_us_key"})
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from flask import Flask, Response

from receiver.core.errors import ConfigurationError
from reconcile.sandbox.app import ADMIN_PREFIX, EVENTS_PREFIX, create_app, json_response
from reconcile.sandbox.errors import SandboxError, not_found
from reconcile.sandbox.server import ServingBase
from reconcile.sandbox.state import Sandbox

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

MERCHANTS_PREFIX = ADMIN_PREFIX + "/merchants"


class MerchantsApp:
    """A WSGI app serving ``sandboxes`` (one merchant each) on one base URL (see the module
    docstring for the routing)."""

    def __init__(self, sandboxes: Iterable[Sandbox]) -> None:
        self._sandboxes: tuple[Sandbox, ...] = tuple(sandboxes)
        if not self._sandboxes:
            raise ConfigurationError("the sandbox needs at least one merchant")
        self._by_merchant: dict[str, Sandbox] = {}
        used: set[str] = set()
        for index, sandbox in enumerate(self._sandboxes):
            for name in dict.fromkeys((sandbox.merchant_id, *sandbox.profile_ids)):
                if name in used:
                    raise ConfigurationError(
                        f"merchant and profile ids must be unique: {name!r} is used twice"
                    )
                used.add(name)
            self._by_merchant[sandbox.merchant_id] = sandbox
            for other in self._sandboxes[:index]:
                if sandbox.shares_api_key_with(other):
                    raise ConfigurationError(
                        f"merchants {other.merchant_id!r} and {sandbox.merchant_id!r} have the "
                        "same API key: a key must pick one merchant"
                    )
        self._apps: dict[str, Flask] = {s.merchant_id: create_app(s) for s in self._sandboxes}

    def __repr__(self) -> str:
        return f"MerchantsApp({', '.join(s.merchant_id for s in self._sandboxes)})"

    @property
    def sandboxes(self) -> tuple[Sandbox, ...]:
        """The merchants, in the order given."""
        return self._sandboxes

    def sandbox(self, merchant_id: str) -> Sandbox:
        """The merchant with that merchant (or profile) id (:class:`KeyError` if none)."""
        found = self._named(merchant_id)
        if found is None:
            raise KeyError(merchant_id)
        return found

    def _named(self, name: str) -> Sandbox | None:
        """The merchant whose id, or the id of one of whose profiles, ``name`` is."""
        found = self._by_merchant.get(name)
        if found is None:
            found = next((s for s in self._sandboxes if s.has_profile(name)), None)
        return found

    def app_for(self, merchant_id: str) -> Flask:
        """The Flask app of one merchant (the one its requests are handed to)."""
        return self._apps[self.sandbox(merchant_id).merchant_id]

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path: str = environ.get("PATH_INFO") or "/"
        if path == ADMIN_PREFIX or path.startswith(ADMIN_PREFIX + "/"):
            return self._admin(environ, start_response, path)
        given: str | None = environ.get("HTTP_API_KEY")
        if path.startswith(EVENTS_PREFIX):
            named = self._named(path[len(EVENTS_PREFIX) :].split("/", 1)[0])
            target = named or self._by_admin_key(given) or self._sandboxes[0]
        else:
            target = self._by_api_key(given) or self._sandboxes[0]
        return self._apps[target.merchant_id](environ, start_response)

    def _by_api_key(self, given: str | None) -> Sandbox | None:
        # Every key is compared (each in constant time): no early answer tells which matched.
        matches = [s for s in self._sandboxes if s.check_api_key(given)]
        return matches[0] if matches else None

    def _by_admin_key(self, given: str | None) -> Sandbox | None:
        matches = [s for s in self._sandboxes if s.check_admin_key(given)]
        return matches[0] if matches else None

    def _admin(
        self, environ: WSGIEnvironment, start_response: StartResponse, path: str
    ) -> Iterable[bytes]:
        if path in (MERCHANTS_PREFIX, MERCHANTS_PREFIX + "/"):
            if environ.get("REQUEST_METHOD") != "GET":
                message = "The HTTP method is not applicable for this API"
                error = SandboxError(405, "IR_03", "invalid_request", message)
                return self._answer(error.body(), error.status)(environ, start_response)
            return self._answer(self.listing())(environ, start_response)
        if path.startswith(MERCHANTS_PREFIX + "/"):
            merchant_id, _, rest = path[len(MERCHANTS_PREFIX) + 1 :].partition("/")
            sandbox = self._named(merchant_id)
            if sandbox is None:
                error = not_found("Merchant account")
                return self._answer(error.body(), error.status)(environ, start_response)
            inner = dict(environ, PATH_INFO=f"{ADMIN_PREFIX}/{rest}")
            return self._apps[sandbox.merchant_id](inner, start_response)
        if len(self._sandboxes) == 1:
            return self._apps[self._sandboxes[0].merchant_id](environ, start_response)
        message = (
            f"This sandbox serves several merchants: use {MERCHANTS_PREFIX}/<merchant_id>"
            f"{path[len(ADMIN_PREFIX) :]}"
        )
        error = SandboxError(404, "IR_02", "invalid_request", message)
        return self._answer(error.body(), error.status)(environ, start_response)

    def listing(self) -> list[dict[str, Any]]:
        """The merchants as ``GET /__sandbox/merchants`` answers them (no key, no secret):
        the default profile's id and webhook URL, and every profile's in ``profiles``."""
        return [
            {
                "merchant_id": s.merchant_id,
                "profile_id": s.profile_id,
                "webhook_url": s.webhook_url,
                "profiles": [
                    {"profile_id": p, "webhook_url": s.profile(p).webhook_url}
                    for p in s.profile_ids
                ],
                "admin_path": f"{MERCHANTS_PREFIX}/{s.merchant_id}",
            }
            for s in self._sandboxes
        ]

    def _answer(self, data: Any, status: int = 200) -> Response:
        """A JSON answer of this router, with the rate-limit headers every answer carries."""
        response = json_response(data, status)
        limiter = self._sandboxes[0].rate_limiter
        remaining, reset = limiter.peek()
        response.headers["X-RateLimit-Limit"] = str(limiter.limit)
        response.headers["X-RateLimit-Remaining"] = str(max(remaining, 0))
        response.headers["X-RateLimit-Reset"] = str(reset)
        return response


class MerchantsServer(ServingBase):
    """Several merchants (:class:`~reconcile.sandbox.state.Sandbox` objects, each with its own
    keys, webhook URL and secret) served on one loopback base URL by a :class:`MerchantsApp`.

    Use it as a context manager, or call :meth:`start` and :meth:`stop`; it starts and stops
    every merchant's webhook delivery and sets their ``public_url``. ``host``, ``port``,
    ``tick_interval`` and ``access_log`` are :class:`~reconcile.sandbox.server.SandboxServer`'s.
    """

    def __init__(
        self,
        sandboxes: Iterable[Sandbox],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        tick_interval: float | None = None,
        access_log: bool = False,
    ) -> None:
        super().__init__(host=host, port=port, tick_interval=tick_interval, access_log=access_log)
        self._app = MerchantsApp(sandboxes)

    def __repr__(self) -> str:
        where = self.base_url if self._server is not None else "stopped"
        ids = ", ".join(repr(s.merchant_id) for s in self._app.sandboxes)
        return f"MerchantsServer({where}, merchant_ids=[{ids}])"

    @property
    def app(self) -> MerchantsApp:
        """The WSGI app that routes each request to its merchant."""
        return self._app

    @property
    def sandboxes(self) -> tuple[Sandbox, ...]:
        """The merchants, in the order given."""
        return self._app.sandboxes

    def sandbox(self, merchant_id: str) -> Sandbox:
        """The merchant with that merchant (or profile) id (:class:`KeyError` if none)."""
        return self._app.sandbox(merchant_id)

    def admin_url(self, merchant_id: str) -> str:
        """The base of one merchant's sandbox admin routes (``.../__sandbox/merchants/<id>``)."""
        return f"{self.base_url}{MERCHANTS_PREFIX}/{self.sandbox(merchant_id).merchant_id}"

    def _sandboxes(self) -> Sequence[Sandbox]:
        return self._app.sandboxes

    def _wsgi_app(self) -> WSGIApplication:
        return self._app
