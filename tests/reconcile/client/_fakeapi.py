"""A small in-test processor: the list endpoints with the real server's semantics, plus scripts.

It keeps creation and modification times in microseconds but prints them with milliseconds,
as Hyperswitch does (Postgres stores microseconds, the API prints three decimals), so a client
that pages by the printed time is caught losing the unread rows of a boundary millisecond.

* ``GET /payments/list``: ``created.gte/.gt/.lte/.lt``/``created`` (all inclusive),
  ``ending_before``/``starting_after`` cursors, ``limit`` 1..100, ``created`` DESC, ``{size,
  data}``, unknown parameters rejected with 400.
* ``POST /payments/list`` (the seed's): ``{limit, offset, created_gte, created_lte}`` ->
  ``{data, total_count, has_more}``.
* ``POST /refunds/list``: ``start_time``/``end_time`` on creation, ``modified_at`` DESC, offset,
  ``{count, total_count, data}``.
* ``GET /payouts/list`` (``{size, data}``, limit <= 100) and ``POST /payouts/list`` (limit <= 20,
  offset, ``{size, data, total_count}``), ``created`` DESC.
* ``GET /disputes/list``: ``modified_at`` DESC, offset, a bare JSON array.
* ``POST /refunds/list`` also takes the seed's ``created_gte``/``created_lte``/``status``.
* ``GET /{payments,refunds,payouts,disputes,mandates}/<id>`` and ``GET /health`` (plain text).
* The admin events API, authenticated by ``ADMIN_KEY``: ``POST /events/<merchant_id>``
  (``EventListConstraints``, limit <= 100, bounds within 90 days of ``now``, ``created`` DESC,
  ``{events, total_count}``), ``GET /events/<m>/<event_id>/attempts``, ``POST .../retry``.

``script`` queues canned ``(status, headers, body, delay)`` answers that are served first, for
retry tests; ``after_list`` is called after every list answer (to change data between pages);
``misbehave`` makes every list answer lie in the ways of :class:`Misbehaviour`. ``fetch`` calls
the endpoints in-process (no HTTP), with the signature of :class:`reconcile.client.paging.Fetch`.
"""

from __future__ import annotations

import json
import json as _json_module
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server
from werkzeug.wrappers import Request, Response

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: Long and distinctive, so a leak is found by a plain substring search.
API_KEY = "snd_TESTKEY_9f2c4e7a1b8d3f6e0a5c9b2d4f7e1a3c"
#: The admin key of the events API (no prefix), as distinctive.
ADMIN_KEY = "ADMINKEY_5e8a1c3f7b9d2e4a6c0f8b1d3e5a7c9f"
#: The fixed Unix time of the injected clock.
NOW = 1_700_000_000.0


class Sleeps(list[float]):
    """An injected ``sleep`` that records instead of sleeping."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def to_us(when: datetime) -> int:
    return (when - EPOCH) // timedelta(microseconds=1)


def iso_ms(us: int) -> str:
    """Printed like Hyperswitch: milliseconds (truncated) and ``Z``."""
    when = EPOCH + timedelta(microseconds=us)
    # Not strftime: glibc prints year 1 as "1", not "0001".
    return f"{when.isoformat(timespec='milliseconds')[:-6]}Z"


@dataclass
class Obj:
    id: str
    created_us: int
    modified_us: int
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Scripted:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | str | dict[str, Any] = b""
    delay: float = 0.0


@dataclass
class Misbehaviour:
    """Ways a list endpoint can lie (all off: an honest server)."""

    #: Ignore every time filter (return rows of any creation time).
    ignore_time: bool = False
    #: Ignore the offset (every page starts at the first row).
    ignore_offset: bool = False
    #: Answer every list call with the first answer of that endpoint.
    repeat_first: bool = False
    #: Rewrite ``total_count`` (given the true one).
    total: Callable[[int], int] | None = None
    #: Force ``has_more`` where the answer has it.
    has_more: bool | None = None
    #: Rows appended to every answer's rows, given (path, the request's (low, high) creation
    #: bounds in microseconds, ``None`` where absent, the rows served).
    extra_rows: Callable[[str, tuple[int | None, int | None], list[Any]], list[Any]] | None = None


@dataclass
class Seen:
    method: str
    path: str
    raw_uri: str
    query: dict[str, list[str]]
    body: Any
    headers: dict[str, str]


class BadRequest(Exception):
    def __init__(self, message: str, code: str = "IR_06") -> None:
        super().__init__(message)
        self.code = code


KINDS = {
    "payments": ("payment_id", "created", "modified_at"),
    "refunds": ("refund_id", "created_at", "updated_at"),
    "payouts": ("payout_id", "created", "modified_at"),
    "disputes": ("dispute_id", "created_at", "modified_at"),
    "mandates": ("mandate_id", "created", "modified_at"),
}
#: The time filters of every list (what ``Misbehaviour.ignore_time`` drops).
TIME_FILTERS = frozenset(
    {
        "created",
        "created.gte",
        "created.gt",
        "created.lte",
        "created.lt",
        "created_gte",
        "created_lte",
        "start_time",
        "end_time",
        "created_after",
        "created_before",
    }
)
EVENTS_BODY = {
    "created_after",
    "created_before",
    "limit",
    "offset",
    "object_id",
    "event_id",
    "profile_id",
    "event_classes",
    "event_types",
    "is_delivered",
}

GET_PAYMENTS_PARAMS = {
    "customer_id",
    "starting_after",
    "ending_before",
    "limit",
    "created",
    "created.lt",
    "created.gt",
    "created.lte",
    "created.gte",
}
SEED_PAYMENTS_BODY = {
    "limit",
    "offset",
    "created_gte",
    "created_lte",
    "status",
    "customer_id",
    "currency",
    "payment_method",
}
REFUNDS_BODY = {
    "payment_id",
    "refund_id",
    "profile_id",
    "limit",
    "offset",
    "start_time",
    "end_time",
    "amount_filter",
    "connector",
    "merchant_connector_id",
    "currency",
    "refund_status",
    # the seed's form (processor-interface.md)
    "created_gte",
    "created_lte",
    "status",
}
GET_PAYOUTS_PARAMS = {
    "customer_id",
    "starting_after",
    "ending_before",
    "limit",
    "created",
    "start_time",
    "end_time",
}
POST_PAYOUTS_BODY = {
    "payout_id",
    "merchant_order_reference_id",
    "profile_id",
    "customer_id",
    "limit",
    "offset",
    "start_time",
    "end_time",
    "connector",
    "currency",
    "status",
    "payout_method",
    "entity_type",
}
DISPUTES_PARAMS = {
    "dispute_id",
    "payment_id",
    "limit",
    "offset",
    "profile_id",
    "dispute_status",
    "dispute_stage",
    "connector",
    "currency",
    "reason",
    "merchant_connector_id",
    "start_time",
    "end_time",
}


def _parse_time(value: Any, name: str) -> int:
    if not isinstance(value, str):
        raise BadRequest(f"{name} must be a timestamp")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise BadRequest(f"{name} is not an ISO 8601 timestamp") from None
    if parsed.tzinfo is None:
        raise BadRequest(f"{name} needs an offset")
    return to_us(parsed)


def _limit(value: Any, maximum: int, default: int = 10) -> int:
    if value is None:
        return default
    try:
        limit = int(value)
    except (TypeError, ValueError):
        raise BadRequest("limit must be an integer") from None
    if not 1 <= limit <= maximum:
        raise BadRequest(f"limit should be in between 1 and {maximum}")
    return limit


def _offset(value: Any) -> int:
    try:
        offset = int(value or 0)
    except (TypeError, ValueError):
        raise BadRequest("offset must be an integer") from None
    if offset < 0:
        raise BadRequest("offset must not be negative")
    return offset


def _deny_unknown(given: Iterable[str], known: set[str]) -> None:
    unknown = sorted(set(given) - known)
    if unknown:
        raise BadRequest(f"unknown field `{unknown[0]}`")


class _QuietHandler(WSGIRequestHandler):
    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass


class FakeProcessor:
    """The state and WSGI app of the fake; see the module docstring."""

    def __init__(self, api_key: str) -> None:
        self.api_key = api_key
        self.lock = threading.RLock()
        self.objects: dict[str, dict[str, Obj]] = {kind: {} for kind in KINDS}
        self.scripts: deque[Scripted] = deque()
        self.seen: list[Seen] = []
        self.after_list: Callable[[FakeProcessor, str, list[Obj]], None] | None = None
        self.misbehave = Misbehaviour()
        self.base_url = ""
        self.echo_key_in_errors = False
        self.admin_key = ADMIN_KEY
        #: The events API's "now" (its 90-day limit is counted from it).
        self.now = datetime.now(UTC)
        self.events: dict[str, Obj] = {}
        self.attempts: dict[str, list[dict[str, Any]]] = {}
        self.retried: list[str] = []
        self._first: dict[tuple[str, str], Any] = {}

    # -- data --------------------------------------------------------------------------------

    def add(self, kind: str, obj_id: str, created: datetime | int, **extra: Any) -> Obj:
        created_us = created if isinstance(created, int) else to_us(created)
        obj = Obj(obj_id, created_us, created_us, dict(extra))
        with self.lock:
            self.objects[kind][obj_id] = obj
        return obj

    def add_many(
        self, kind: str, prefix: str, count: int, first: datetime, step: timedelta
    ) -> list[str]:
        ids = []
        for i in range(count):
            obj_id = f"{prefix}{i:05d}"
            self.add(kind, obj_id, first + i * step)
            ids.append(obj_id)
        return ids

    def add_event(
        self, event_id: str, created: datetime | int, *, delivered: bool = False, **extra: Any
    ) -> Obj:
        created_us = created if isinstance(created, int) else to_us(created)
        obj = Obj(event_id, created_us, created_us, {"is_delivery_successful": delivered, **extra})
        with self.lock:
            self.events[event_id] = obj
        return obj

    def touch(self, kind: str, obj_id: str) -> None:
        """Modify an object now: it jumps to the front of modification-ordered lists."""
        with self.lock:
            newest = max(o.modified_us for o in self.objects[kind].values())
            self.objects[kind][obj_id].modified_us = newest + 1000

    def script(self, *answers: Scripted) -> None:
        self.scripts.extend(answers)

    def list_requests(self, path: str) -> list[Seen]:
        return [s for s in self.seen if s.path == path]

    def _render(self, kind: str, obj: Obj) -> dict[str, Any]:
        id_field, created_field, modified_field = KINDS[kind]
        return {
            id_field: obj.id,
            created_field: iso_ms(obj.created_us),
            modified_field: iso_ms(obj.modified_us),
            "status": "succeeded",
            **obj.extra,
        }

    def _window(
        self, kind: str, low: int | None, high: int | None, *, by_modified: bool
    ) -> list[Obj]:
        rows = [
            o
            for o in self.objects[kind].values()
            if (low is None or o.created_us >= low) and (high is None or o.created_us <= high)
        ]
        if by_modified:
            rows.sort(key=lambda o: (o.modified_us, o.id), reverse=True)
        else:
            rows.sort(key=lambda o: (o.created_us, o.id), reverse=True)
        return rows

    # -- endpoints ---------------------------------------------------------------------------

    def _get_payments(self, q: dict[str, str]) -> tuple[Any, list[Obj]]:
        _deny_unknown(q, GET_PAYMENTS_PARAMS)
        limit = _limit(q.get("limit"), 100)
        times = {n: _parse_time(q[n], n) for n in q if n.startswith("created")}
        low = times.get("created.gte", times.get("created.gt", times.get("created")))
        high = times.get("created.lte", times.get("created.lt", times.get("created")))
        if high is None and "ending_before" in q:
            high = self._cursor("payments", q["ending_before"])
        if low is None and "starting_after" in q:
            low = self._cursor("payments", q["starting_after"])
        rows = self._window("payments", low, high, by_modified=False)[:limit]
        return {"size": len(rows), "data": [self._render("payments", o) for o in rows]}, rows

    def _cursor(self, kind: str, obj_id: str) -> int:
        obj = self.objects[kind].get(obj_id)
        if obj is None:
            raise BadRequest(f"{obj_id} does not exist", "IR_05")
        return obj.created_us

    def _seed_payments(self, body: dict[str, Any]) -> tuple[Any, list[Obj]]:
        _deny_unknown(body, SEED_PAYMENTS_BODY)
        limit, offset = _limit(body.get("limit"), 100), _offset(body.get("offset"))
        low = _parse_time(body["created_gte"], "created_gte") if "created_gte" in body else None
        high = _parse_time(body["created_lte"], "created_lte") if "created_lte" in body else None
        matching = self._window("payments", low, high, by_modified=False)
        rows = matching[offset : offset + limit]
        return {
            "data": [self._render("payments", o) for o in rows],
            "total_count": len(matching),
            "has_more": offset + len(rows) < len(matching),
        }, rows

    def _refunds(self, body: dict[str, Any]) -> tuple[Any, list[Obj]]:
        _deny_unknown(body, REFUNDS_BODY)
        limit, offset = _limit(body.get("limit"), 100), _offset(body.get("offset"))
        low = _parse_time(body["start_time"], "start_time") if "start_time" in body else None
        high = _parse_time(body["end_time"], "end_time") if "end_time" in body else None
        if "created_gte" in body:
            low = _parse_time(body["created_gte"], "created_gte")
        if "created_lte" in body:
            high = _parse_time(body["created_lte"], "created_lte")
        matching = self._window("refunds", low, high, by_modified=True)
        rows = matching[offset : offset + limit]
        return {
            "count": len(rows),
            "total_count": len(matching),
            "data": [self._render("refunds", o) for o in rows],
        }, rows

    def _get_payouts(self, q: dict[str, str]) -> tuple[Any, list[Obj]]:
        _deny_unknown(q, GET_PAYOUTS_PARAMS)
        limit = _limit(q.get("limit"), 100)
        low = _parse_time(q["start_time"], "start_time") if "start_time" in q else None
        high = _parse_time(q["end_time"], "end_time") if "end_time" in q else None
        if high is None and "ending_before" in q:
            high = self._cursor("payouts", q["ending_before"])
        rows = self._window("payouts", low, high, by_modified=False)[:limit]
        return {"size": len(rows), "data": [self._render("payouts", o) for o in rows]}, rows

    def _post_payouts(self, body: dict[str, Any]) -> tuple[Any, list[Obj]]:
        _deny_unknown(body, POST_PAYOUTS_BODY)
        limit, offset = _limit(body.get("limit"), 20), _offset(body.get("offset"))
        low = _parse_time(body["start_time"], "start_time") if "start_time" in body else None
        high = _parse_time(body["end_time"], "end_time") if "end_time" in body else None
        matching = self._window("payouts", low, high, by_modified=False)
        rows = matching[offset : offset + limit]
        return {
            "size": len(rows),
            "data": [self._render("payouts", o) for o in rows],
            "total_count": len(matching),
        }, rows

    def _disputes(self, q: dict[str, str]) -> tuple[Any, list[Obj]]:
        _deny_unknown(q, DISPUTES_PARAMS)
        limit, offset = _limit(q.get("limit"), 100), _offset(q.get("offset"))
        low = _parse_time(q["start_time"], "start_time") if "start_time" in q else None
        high = _parse_time(q["end_time"], "end_time") if "end_time" in q else None
        rows = self._window("disputes", low, high, by_modified=True)[offset : offset + limit]
        return [self._render("disputes", o) for o in rows], rows

    def _render_event(self, obj: Obj) -> dict[str, Any]:
        return {
            "event_id": obj.id,
            "merchant_id": "merchant_fake",
            "profile_id": "pro_fake",
            "object_id": obj.extra.get("object_id", "pay_fake"),
            "event_type": "payment_succeeded",
            "event_class": "payments",
            "initial_attempt_id": obj.id,
            "created": iso_ms(obj.created_us),
            **obj.extra,
        }

    def _list_events(self, body: dict[str, Any]) -> tuple[Any, list[Obj]]:
        _deny_unknown(body, EVENTS_BODY)
        limit = body.get("limit")
        if isinstance(limit, int) and limit > 100:
            raise BadRequest("`limit` must be a number less than 100", "IR_06")
        limit = 100 if limit is None else int(limit)
        offset = _offset(body.get("offset"))
        begin = datetime.combine(
            (self.now - timedelta(days=90)).date(), datetime.min.time(), tzinfo=UTC
        )
        bounds = {}
        for name in ("created_after", "created_before"):
            if name in body:
                when = _parse_time(body[name], name)
                if when < to_us(begin):
                    raise BadRequest(f"`{name}` must be a timestamp within the past 90 days.")
                bounds[name] = when
        low, high = bounds.get("created_after"), bounds.get("created_before")
        if low is not None and high is not None and low > high:
            raise BadRequest("The `created_after` timestamp must be an earlier timestamp")
        delivered = body.get("is_delivered")
        matching = [
            o
            for o in self.events.values()
            if (low is None or o.created_us >= low)
            and (high is None or o.created_us <= high)
            and (delivered is None or o.extra.get("is_delivery_successful") == delivered)
        ]
        matching.sort(key=lambda o: (o.created_us, o.id), reverse=True)
        rows = matching[offset : offset + limit]
        return {
            "events": [self._render_event(o) for o in rows],
            "total_count": len(matching),
        }, rows

    def _attempt(self, event_id: str, kind: str) -> dict[str, Any]:
        return {
            **self._render_event(self.events[event_id]),
            "delivery_attempt": kind,
            "request": {"body": "{}", "headers": []},
            "response": {"status_code": 200, "body": "ok", "headers": []},
        }

    # -- the lies ------------------------------------------------------------------------------

    def _lie_in(self, query: dict[str, Any]) -> dict[str, Any]:
        lies = self.misbehave
        drop = (TIME_FILTERS if lies.ignore_time else set()) | (
            {"offset"} if lies.ignore_offset else set()
        )
        return {k: v for k, v in query.items() if k not in drop}

    @staticmethod
    def bounds_of(query: dict[str, Any]) -> tuple[int | None, int | None]:
        """The (low, high) creation bounds of a list request, in microseconds."""
        low = high = None
        for name in ("created.gte", "created_gte", "start_time", "created_after"):
            if name in query:
                low = _parse_time(query[name], name)
        for name in ("created.lte", "created_lte", "end_time", "created_before"):
            if name in query:
                high = _parse_time(query[name], name)
        return low, high

    def _lie_out(
        self, method: str, path: str, document: Any, bounds: tuple[int | None, int | None]
    ) -> Any:
        lies = self.misbehave
        if lies.repeat_first:
            document = self._first.setdefault((method, path), document)
        document = json.loads(json.dumps(document))  # a copy to lie in
        if isinstance(document, dict):
            if lies.total is not None and "total_count" in document:
                document["total_count"] = lies.total(document["total_count"])
            if lies.has_more is not None and "has_more" in document:
                document["has_more"] = lies.has_more
        if lies.extra_rows is not None:
            rows = document if isinstance(document, list) else None
            if isinstance(document, dict):
                rows = document.get("data", document.get("events"))
            if isinstance(rows, list):
                rows.extend(lies.extra_rows(path, bounds, list(rows)))
        return document

    # -- in-process calls -----------------------------------------------------------------------

    def fetch(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None = None,
        json: Mapping[str, Any] | None = None,
    ) -> Any:
        """Call an endpoint without HTTP (the client's ``request`` signature); a 4xx raises."""
        query = {k: str(v) for k, v in (params or {}).items()}
        body = _json_module.loads(_json_module.dumps(json)) if json is not None else None
        with self.lock:
            self.seen.append(Seen(method, path, path, {k: [v] for k, v in query.items()}, body, {}))
        status, document = self._handle(method, path, query, body)
        if status >= 400:
            raise FakeError(status, document)
        return document

    # -- WSGI ----------------------------------------------------------------------------------

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        request = Request(environ)
        response = self._respond(request)
        return response(environ, start_response)

    def _respond(self, request: Request) -> Response:
        raw = request.get_data()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        with self.lock:
            self.seen.append(
                Seen(
                    request.method,
                    request.path,
                    request.environ.get("REQUEST_URI", ""),
                    {k: request.args.getlist(k) for k in request.args},
                    body,
                    dict(request.headers),
                )
            )
            scripted = self.scripts.popleft() if self.scripts else None
        if scripted is not None:
            if scripted.delay:
                time.sleep(scripted.delay)
            payload = scripted.body
            if isinstance(payload, dict):
                payload = json.dumps(payload)
            return Response(payload, status=scripted.status, headers=scripted.headers)
        key = request.headers.get("api-key")
        admin = request.path.startswith("/events/")
        if key != (self.admin_key if admin else self.api_key):
            message = "API key not provided or invalid API key used"
            if self.echo_key_in_errors:
                message += f": {key}"
            return _error(401, "authentication_error", "AU_01", message)
        query = {k: request.args[k] for k in request.args}
        status, document = self._handle(request.method, request.path, query, body)
        if isinstance(document, str):
            return Response(document, status=status, content_type="text/plain")
        return _json(status, document)

    def _handle(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
        """(status, JSON document or text) of one call; errors as the error document."""
        try:
            return 200, self._route(method, path, query, body)
        except BadRequest as exc:
            status = 404 if exc.code == "IR_05" else 400
            return status, error_body("invalid_request", exc.code, str(exc))

    def _route(self, method: str, path: str, query: dict[str, str], body: Any) -> Any:
        if method == "GET" and path == "/health":
            return "health is good"
        lists: dict[tuple[str, str], Callable[[dict[str, Any]], tuple[Any, list[Obj]]]] = {
            ("GET", "/payments/list"): self._get_payments,
            ("POST", "/payments/list"): self._seed_payments,
            ("POST", "/refunds/list"): self._refunds,
            ("GET", "/payouts/list"): self._get_payouts,
            ("POST", "/payouts/list"): self._post_payouts,
            ("GET", "/disputes/list"): self._disputes,
        }
        parts = path.strip("/").split("/")
        handler = lists.get((method, path))
        if handler is None and method == "POST" and len(parts) == 2 and parts[0] == "events":
            handler = self._list_events
        if handler is not None:
            given = query if method == "GET" else _object(body)
            with self.lock:
                document, rows = handler(self._lie_in(given))
                document = self._lie_out(method, path, document, self.bounds_of(given))
            if self.after_list is not None:
                self.after_list(self, path, rows)
            return document
        if len(parts) == 4 and parts[0] == "events":
            event_id = parts[2]
            with self.lock:
                if event_id not in self.events:
                    raise BadRequest("Event not found", "IR_05")
                if method == "GET" and parts[3] == "attempts":
                    return self.attempts.get(event_id) or [
                        self._attempt(event_id, "initial_attempt")
                    ]
                if method == "POST" and parts[3] == "retry":
                    self.retried.append(event_id)
                    attempt = self._attempt(event_id, "manual_retry")
                    self.attempts.setdefault(event_id, [self._attempt(event_id, "initial_attempt")])
                    self.attempts[event_id].append(attempt)
                    return attempt
        if method == "GET" and len(parts) == 2 and parts[0] in KINDS:
            with self.lock:
                obj = self.objects[parts[0]].get(parts[1])
                if obj is None:
                    raise BadRequest(f"{parts[0][:-1].capitalize()} does not exist", "IR_05")
                return self._render(parts[0], obj)
        raise BadRequest("Unrecognized request URL", "IR_02")


class FakeError(Exception):
    """An error answer of :meth:`FakeProcessor.fetch` (status and error document)."""

    def __init__(self, status: int, document: Any) -> None:
        super().__init__(f"HTTP {status}: {document}")
        self.status = status
        self.document = document


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def _json(status: int, document: Any) -> Response:
    return Response(json.dumps(document), status=status, content_type="application/json")


def _error(status: int, err_type: str, code: str, message: str) -> Response:
    return _json(status, {"error": {"type": err_type, "code": code, "message": message}})


def error_body(err_type: str, code: str, message: str) -> dict[str, Any]:
    return {"error": {"type": err_type, "code": code, "message": message}}


@dataclass
class Running:
    fake: FakeProcessor
    server: BaseWSGIServer
    thread: threading.Thread


def start(api_key: str) -> Running:
    fake = FakeProcessor(api_key)
    server = make_server("127.0.0.1", 0, fake, threaded=True, request_handler=_QuietHandler)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    fake.base_url = f"http://127.0.0.1:{server.server_port}"
    return Running(fake, server, thread)


def stop(running: Running) -> None:
    running.server.shutdown()
    running.server.server_close()
    running.thread.join(timeout=5)


def ids(rows: Iterable[dict[str, Any]], field_name: str) -> list[str]:
    return [row[field_name] for row in rows]


def chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
