"""The ops console: a server-rendered blueprint the merchant mounts in their own app.

::

    from receiver.web.console import Console

    Console(app, access=lambda: current_user.is_authenticated and current_user.is_admin)
    # or, with a credential (HTTP basic auth): HOOKLEDGER_CONSOLE_PASSWORD (and _USER)

Closed by default: ``init_app`` refuses to start without an access rule, a callable that
checks the merchant's own login (``access=``) or a credential
(``HOOKLEDGER_CONSOLE_PASSWORD``, at least 12 characters; user ``HOOKLEDGER_CONSOLE_USER``,
default ``ops``). A request that passes neither gets 401 (or 403) and not a byte of data.

Every action (requeue, replay) is a POST carrying a per-session CSRF token (Flask's signed
session: the app needs a ``secret_key``); a POST without the right token changes nothing.
Pages send a Content-Security-Policy that allows no script at all, ``X-Frame-Options:
DENY`` and ``Cache-Control: no-store``. Bodies and headers are shown with card numbers and
secrets masked (:mod:`receiver.core.masking`).

Pages: events (newest first; filters by status, type, object, source, time, account; paging), one
event (masked body and headers, the guard's decision, its object's transitions and
projection, the per-handler ledger with tracebacks), dead letters (requeue one or many, with
a dry-run count first), conflicts, stale (and duplicate) events with their reasons, and
reconcile reports with a chart of recoveries and drift over time.

With several processor accounts (:mod:`receiver.core.accounts`), every list takes
``?account=<id>`` (repeatable; any well-formed id, configured or not: a removed account's
history is still there), rows and event pages name their account, and the events page shows
each account's queue (open, oldest open, dead letters). With the default account alone,
nothing of this shows.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from flask import (
    Blueprint,
    Flask,
    Response,
    abort,
    current_app,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from markupsafe import Markup
from werkzeug.wrappers import Response as BaseResponse

import receiver.storage.operator_reads as queries
import receiver.storage.recon_run_reads as recon_runs
import receiver.worker.heartbeat as heartbeat
from receiver.core.accounts import DEFAULT_ACCOUNT, is_account_id
from receiver.core.errors import ConfigurationError
from receiver.core.masking import mask_body, mask_headers
from receiver.storage.operator_actions import EventFilter
from receiver.storage.tables import EventStatus, Source
from receiver.store import Store
from receiver.web.console import story_pages
from receiver.web.console.chart import RunPoint, svg
from receiver.web.state import receiver_state

BLUEPRINT = "hookledger_console"
CSRF_KEY = "hookledger_console_csrf"
CSRF_FIELD = "csrf_token"
PAGE_SIZE = 50
#: At most this many configured accounts are offered in the account filter's list (any
#: other can still be typed into the URL).
ACCOUNT_CHOICES = 200

#: The console's response headers: no script, no framing, no caching of operator data.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


class Console:
    """The ops console extension (see the module docstring).

    Keyword arguments win over ``app.config``, which wins over the environment:
    ``access`` (a callable; true lets the request in), ``password`` / ``username``
    (``HOOKLEDGER_CONSOLE_PASSWORD`` / ``HOOKLEDGER_CONSOLE_USER``), ``url_prefix``
    (``HOOKLEDGER_CONSOLE_PREFIX``, default ``/hookledger``).
    """

    def __init__(
        self,
        app: Flask | None = None,
        *,
        access: Callable[[], bool] | None = None,
        password: str | None = None,
        username: str | None = None,
        url_prefix: str | None = None,
    ) -> None:
        self._access = access
        self._password = password
        self._username = username
        self._prefix = url_prefix
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        def setting(name: str, given: Any, default: Any = None) -> Any:
            if given is not None:
                return given
            key = f"HOOKLEDGER_CONSOLE_{name}"
            if app.config.get(key) is not None:
                return app.config[key]
            return os.environ.get(key, default)

        password = setting("PASSWORD", self._password) or None
        username = str(setting("USER", self._username, "ops"))
        prefix = str(setting("PREFIX", self._prefix, "/hookledger"))
        access = self._access
        if password is None and access is None:
            raise ConfigurationError(
                "the ops console refuses to start without an access rule: pass "
                "Console(app, access=<callable checking your login>) or set "
                "HOOKLEDGER_CONSOLE_PASSWORD"
            )
        if password is not None and len(str(password)) < 12:
            raise ConfigurationError("HOOKLEDGER_CONSOLE_PASSWORD must be at least 12 characters")
        if not app.secret_key:
            raise ConfigurationError(
                "the ops console needs the app's SECRET_KEY (its CSRF tokens live in the "
                "signed session)"
            )
        bp = _blueprint(_Gate(access=access, username=username, password=password))
        app.register_blueprint(bp, url_prefix=prefix)
        app.extensions["hookledger_console"] = self


class _Gate:
    """Who may see the console: the merchant's callable, or the credential."""

    def __init__(
        self, *, access: Callable[[], bool] | None, username: str, password: str | None
    ) -> None:
        self._access = access
        self._expected = f"{username}:{password}".encode() if password is not None else None

    def check(self) -> BaseResponse | None:
        """``None`` when the request may go on, else the refusal (with no data in it)."""
        if self._expected is not None:
            auth = request.authorization
            if auth is not None and auth.type == "basic":
                sent = f"{auth.username or ''}:{auth.password or ''}".encode("utf-8", "replace")
                if hmac.compare_digest(sent, self._expected):
                    return None
        if self._access is not None and self._access():
            return None
        if self._expected is not None:
            return Response(
                "authentication required\n",
                401,
                {"WWW-Authenticate": 'Basic realm="hookledger console", charset="UTF-8"'},
                mimetype="text/plain",
            )
        return Response("forbidden\n", 403, mimetype="text/plain")


def _csrf_token() -> str:
    token = session.get(CSRF_KEY)
    if not isinstance(token, str):
        token = secrets.token_urlsafe(32)
        session[CSRF_KEY] = token
    return token


def _csrf_ok() -> bool:
    expected = session.get(CSRF_KEY)
    sent = request.form.get(CSRF_FIELD, "")
    if not isinstance(expected, str) or not sent:
        return False
    if not hmac.compare_digest(sent.encode(), expected.encode()):
        return False
    # A browser names the page that sent a POST: it must be this site.
    origin = request.headers.get("Origin")
    return origin is None or origin.rstrip("/") == request.host_url.rstrip("/")


def _engine() -> Any:
    return receiver_state(current_app).store.engine


def _store() -> Store:
    return receiver_state(current_app).store


def _when(value: datetime | None) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if value else "–"


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _int(value: str | None, default: int, low: int, high: int) -> int:
    try:
        number = int(value) if value is not None else default
    except ValueError:
        number = default
    return max(low, min(high, number))


def _accounts_from(values: list[str]) -> tuple[str, ...]:
    """Well-formed account ids of ``?account=`` / a form (repeatable or comma-separated)."""
    found = [a.strip() for v in values for a in v.split(",")]
    return tuple(dict.fromkeys(a for a in found if is_account_id(a)))


def _configured_accounts() -> list[str]:
    """The configured accounts' ids (at most :data:`ACCOUNT_CHOICES`); an account source
    that cannot be read answers none (the filter still works from the URL)."""
    try:
        ids = receiver_state(current_app).accounts.ids()
        return sorted(str(a) for a in ids)[:ACCOUNT_CHOICES]
    except Exception:  # noqa: BLE001 - the merchant's own source: a page must still render
        return []


def _several(configured: list[str], shown: Any = ()) -> bool:
    """Whether the installation has more than the default account (configured, or found
    in what is shown: a removed account's history)."""
    return bool(set(configured) - {DEFAULT_ACCOUNT} or set(shown) - {DEFAULT_ACCOUNT})


def _query_from_args(*, statuses: tuple[str, ...] | None = None) -> queries.EventQuery:
    args = request.args
    chosen = (
        statuses
        if statuses is not None
        else tuple(s for s in args.getlist("status") if s in EventStatus.ALL)
    )
    return queries.EventQuery(
        statuses=chosen,
        event_types=tuple(t for t in (args.get("type") or "").split(",") if t.strip()),
        sources=tuple(s for s in args.getlist("source") if s in Source.ALL),
        object=(args.get("object") or "").strip() or None,
        event_id=(args.get("event_id") or "").strip() or None,
        since=_parse_time(args.get("since")),
        until=_parse_time(args.get("until")),
        limit=_int(args.get("limit"), PAGE_SIZE, 1, 500),
        offset=_int(args.get("offset"), 0, 0, 10_000_000),
        accounts=_accounts_from(args.getlist("account")),
    )


def _page_links(page: queries.Page) -> dict[str, str | None]:
    args = request.args.to_dict(flat=False)

    def link(offset: int) -> str:
        args["offset"] = [str(offset)]
        return url_for(request.endpoint or "", **args)  # type: ignore[arg-type]

    prev_offset = max(0, page.offset - page.limit)
    return {
        "prev": link(prev_offset) if page.offset > 0 else None,
        "next": link(page.offset + page.limit) if page.has_more else None,
    }


def _blueprint(gate: _Gate) -> Blueprint:
    bp = Blueprint(BLUEPRINT, __name__, template_folder="templates")

    @bp.before_request
    def guard() -> BaseResponse | None:
        refused = gate.check()
        if refused is not None:
            return refused
        if request.method == "POST" and not _csrf_ok():
            return Response(
                "the form's CSRF token is missing or wrong: nothing was done\n",
                400,
                mimetype="text/plain",
            )
        return None

    @bp.after_request
    def headers(response: Response) -> Response:
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    @bp.context_processor
    def common() -> dict[str, Any]:
        return {
            "csrf_token": _csrf_token,
            "csrf_field": CSRF_FIELD,
            "when": _when,
            "statuses": EventStatus.ALL,
            "sources": Source.ALL,
        }

    def render(template: str, **context: Any) -> str:
        engine = _engine()
        q = context.get("q")
        chosen = tuple(q.accounts) if q is not None else ()
        configured = _configured_accounts()
        ops = heartbeat.check(engine)
        counts = queries.status_counts(engine)
        context.setdefault("counts", counts)
        # The status filter's figures: of the accounts chosen, when some are.
        context.setdefault(
            "filter_counts", queries.status_counts(engine, accounts=chosen) if chosen else counts
        )
        context.setdefault("ops", ops)
        context.setdefault("chosen_accounts", chosen)
        context.setdefault("account_choices", sorted({*configured, *chosen}))
        shown = [*chosen, *ops.accounts]
        if context.get("page") is not None:
            shown += [getattr(r, "account", DEFAULT_ACCOUNT) for r in context["page"].rows]
        if context.get("r") is not None:
            shown.append(context["r"].account)
        context.setdefault("several_accounts", _several(configured, shown))
        return render_template(f"hookledger_console/{template}", **context)

    @bp.get("/")
    def index() -> BaseResponse:
        return redirect(url_for(".events"))

    @bp.get("/events")
    def events() -> str:
        q = _query_from_args()
        page = queries.list_events(_engine(), q, keyring=_store().keyring)
        return render(
            "events.html", page=page, q=q, links=_page_links(page), title="Events", tab="events"
        )

    @bp.get("/events/<int:pk>")
    def event(pk: int) -> str:
        detail = queries.find_event(_engine(), f"#{pk}", keyring=_store().keyring)
        if detail is None:
            abort(404)
        return render(
            "event.html",
            d=detail,
            r=detail.row,
            body=mask_body(detail.body),
            headers=mask_headers(detail.headers),
            title=f"Event #{pk}",
            tab="events",
            done=request.args.get("done"),
        )

    @bp.post("/events/<int:pk>/requeue")
    def requeue_one(pk: int) -> BaseResponse:
        chosen = _store().operations.requeue(
            EventFilter(pks=(pk,), statuses=(EventStatus.DEAD, EventStatus.PENDING))
        )
        done = "requeued" if chosen else "nothing to requeue"
        return redirect(url_for(".event", pk=pk, done=done))

    @bp.post("/events/<int:pk>/replay")
    def replay_one(pk: int) -> BaseResponse:
        from receiver.core.events import parse_event

        pairs = _store().operations.replay(EventFilter(pks=(pk,)), parse=parse_event)
        done = f"replayed as {pairs[0][1]}" if pairs else "nothing to replay"
        return redirect(url_for(".event", pk=pk, done=done))

    @bp.get("/dead")
    def dead() -> str:
        q = _query_from_args(statuses=(EventStatus.DEAD,))
        page = queries.list_events(_engine(), q, keyring=_store().keyring)
        return render(
            "dead.html",
            page=page,
            q=q,
            links=_page_links(page),
            title="Dead letters",
            tab="dead",
            done=request.args.get("done"),
        )

    @bp.post("/dead/requeue")
    def requeue_dead() -> BaseResponse | str:
        form = request.form
        if form.get("scope") == "matching":
            flt = EventFilter(
                event_types=tuple(t for t in (form.get("type") or "").split(",") if t.strip()),
                since=_parse_time(form.get("since")),
                until=_parse_time(form.get("until")),
                statuses=(EventStatus.DEAD,),
                accounts=_accounts_from(form.getlist("account")),
            )
        else:
            pks = tuple(int(p) for p in form.getlist("pk") if p.isdigit())
            if not pks:
                return redirect(url_for(".dead", done="no event selected"))
            flt = EventFilter(pks=pks, statuses=(EventStatus.DEAD,))
        if form.get("confirm") != "yes":
            would = _store().operations.requeue(flt, dry_run=True)
            return render(
                "confirm.html",
                would=would,
                form=form,
                title="Requeue dead letters?",
                tab="dead",
            )
        chosen = _store().operations.requeue(flt)
        return redirect(url_for(".dead", done=f"{len(chosen)} event(s) requeued"))

    @bp.get("/stale")
    def stale() -> str:
        which = request.args.get("decision", EventStatus.STALE)
        decision = which if which in (EventStatus.STALE, EventStatus.DUPLICATE) else "stale"
        q = _query_from_args(statuses=(decision,))
        page = queries.list_events(_engine(), q, keyring=_store().keyring)
        return render(
            "stale.html",
            page=page,
            q=q,
            links=_page_links(page),
            decision=decision,
            title="Stale and duplicate events",
            tab="stale",
        )

    @bp.get("/conflicts")
    def conflicts() -> str:
        offset = _int(request.args.get("offset"), 0, 0, 10_000_000)
        page = queries.list_conflicts(_engine(), limit=PAGE_SIZE, offset=offset)
        return render(
            "conflicts.html", page=page, links=_page_links(page), title="Conflicts", tab="conflicts"
        )

    @bp.get("/conflicts/<int:conflict_id>")
    def conflict(conflict_id: int) -> str:
        body = queries.conflict_body(_engine(), conflict_id, keyring=_store().keyring)
        if body is None:
            abort(404)
        row = queries.get_conflict(_engine(), conflict_id)
        stored = None
        if row is not None and row.event_pk is not None:
            found = queries.find_event(_engine(), f"#{row.event_pk}", keyring=_store().keyring)
            stored = mask_body(found.body) if found is not None else None
        return render(
            "conflict.html",
            c=row,
            conflicting=mask_body(body),
            stored=stored,
            title=f"Conflict {conflict_id}",
            tab="conflicts",
        )

    @bp.get("/reconcile")
    def reconcile() -> str:
        offset = _int(request.args.get("offset"), 0, 0, 10_000_000)
        page = recon_runs.reconcile_runs(_engine(), limit=PAGE_SIZE, offset=offset)
        recent = recon_runs.reconcile_runs(_engine(), limit=60).rows
        points = []
        for run in reversed(recent):
            if run.status in ("running", "dry_run"):
                continue
            figures = recon_runs.recon_figures(run.report)
            recovered: dict[str, int] = {}
            for f in figures:
                recovered[f.path] = recovered.get(f.path, 0) + f.recovered
            points.append(
                RunPoint(
                    run_id=run.id,
                    at=run.finished_at or run.started_at,
                    status=run.status,
                    recovered=recovered,
                    unresolved=sum(f.unresolved for f in figures),
                )
            )
        rows = [
            (run, {f.path: f.recovered for f in recon_runs.recon_figures(run.report)})
            for run in page.rows
        ]
        return render(
            "reconcile.html",
            page=page,
            rows=rows,
            links=_page_links(page),
            chart=Markup(svg(points)),  # noqa: S704 - built from escaped parts (chart.py)
            title="Reconcile reports",
            tab="reconcile",
        )

    @bp.get("/reconcile/<int:run_id>")
    def reconcile_run(run_id: int) -> str:
        run = recon_runs.get_run(_engine(), run_id)
        if run is None:
            abort(404)
        return render(
            "run.html",
            run=run,
            figures=recon_runs.recon_figures(run.report),
            report=json.dumps(run.report, indent=2, default=str),
            title=f"Reconcile run #{run_id}",
            tab="reconcile",
        )

    # Find an order, one object's story (receiver/web/console/story_pages.py).
    story_pages.register(bp, render, accounts_from=_accounts_from)
    return bp


__all__ = ["Console", "SECURITY_HEADERS"]
