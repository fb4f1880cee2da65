"""The events-API path: undelivered webhooks, recovered with their original signed bytes.

Where the merchant has the processor's admin credential, Hyperswitch's events API lists the
webhooks it could not deliver (``POST /events/{merchant_id}`` with ``is_delivered: false``,
the last 90 days) and keeps each one's original request (``GET
/events/{merchant_id}/{event_id}/attempts``). This path fetches that request, verifies its
``X-Webhook-Signature-512`` over the original bytes with the configured webhook secrets,
and stores it under its **original** ``event_id`` with source ``recovered``: a later
processor retry of the same event is then an exact duplicate, and the handlers see the
very event the processor meant to send (not a synthesised one). A signature that does not
verify is reported and never stored. Optionally the processor is asked to re-send it.

An undelivered event whose request is not recorded yet (no attempt, or attempts without a
``request`` or with a ``null`` body: the processor was stopped mid-delivery) is *waiting*, not
a bad row: nothing is wrong yet. The report counts it as ``waiting`` (the run is not
unresolved) and the events watermark stops at the oldest waiting event, so a later run lists
it again and recovers it once its request exists.

An undelivered event whose transition hookledger already holds (the lists recovered it in
an earlier run, when the events API had no request for it yet, and it was dispatched or
waits in the inbox) is stored all the same, for its original bytes, and counted
``already_known``, not ``recovered`` a second time: its dispatch is a duplicate transition.

On an adopted account, undelivered events created before the earlier system's history ended
(:attr:`receiver.core.guard.CutOver.history_ends`: the cut-over, or just before the first
delivery when the deploy came before adoption) are left alone (``before_cutover``): the
same line the guard and the watermarks draw. One created after it (a dispute won between
the deploy and adoption, which adoption recorded as seen) is recovered and dispatched.

The events API lists the merchant's events of every business profile: this path asks for the
account's one profile (``profile_id``) when it names exactly one, and keeps only the events
that are this account's (:mod:`reconcile.core.ownership`, the receive path's rule), before
fetching their attempts: another profile's event is signed with that profile's key, and is
neither recovered here nor a bad signature of this account (``other_profiles``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final, Protocol

from sqlalchemy import Table, select

from receiver.core.accounts import DEFAULT_ACCOUNT, AccountSource
from receiver.core.clock import as_utc
from receiver.core.errors import MalformedEvent, SignatureError
from receiver.core.events import Event, parse_event, parse_timestamp
from receiver.core.guard import ADOPTED
from receiver.core.signature import SIGNATURE_HEADER, Secret, verify
from receiver.core.transitions import make_state, read_event
from receiver.storage.account_table import StoredAccounts
from receiver.storage.tables import InboxEvent, Source
from receiver.store import Store
from reconcile.client.paging import Pager
from reconcile.core.diff import clean_text
from reconcile.core.errors import ProcessorError, escape_id
from reconcile.core.ownership import NO_PROFILE, Ownership
from reconcile.core.report import SAMPLE, EventsReport
from reconcile.storage.store import ReconcileStore

log = logging.getLogger("reconcile.undelivered")

E: Table = InboxEvent.__table__  # type: ignore[attr-defined]

#: Listed events looked up in the inbox together.
BATCH: Final = 100


class EventsApi(Protocol):
    """What this path needs of the admin events client
    (:class:`reconcile.client.events_api.EventsClient`)."""

    def iter_events(
        self,
        merchant_id: str,
        start: datetime,
        end: datetime,
        *,
        is_delivered: bool | None = False,
        page_size: int = 100,
        max_requests: int | None = None,
        on_stuck: Any = "raise",
        profile_id: str | None = None,
    ) -> Pager: ...

    def event_attempts(self, merchant_id: str, event_id: str) -> list[dict[str, Any]]: ...

    def retry_event(self, merchant_id: str, event_id: str) -> dict[str, Any]: ...


def _note(sample: list[str], item: str) -> None:
    if len(sample) < SAMPLE:
        sample.append(item)


def initial_request(attempts: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The stored request of an event's initial delivery attempt (every retry re-sends it)."""
    for attempt in attempts:
        if not isinstance(attempt, Mapping):
            continue
        initial = attempt.get("delivery_attempt") == "initial_attempt" or (
            attempt.get("event_id") is not None
            and attempt.get("event_id") == attempt.get("initial_attempt_id")
        )
        if initial and isinstance(attempt.get("request"), Mapping):
            return attempt["request"]  # type: ignore[no-any-return]
    for attempt in attempts:
        if isinstance(attempt, Mapping) and isinstance(attempt.get("request"), Mapping):
            return attempt["request"]  # type: ignore[no-any-return]
    return None


def header_pairs(raw: object) -> list[tuple[str, str]]:
    """Request headers as (name, value) pairs (the API sends ``[[name, value], ...]``)."""
    pairs: list[tuple[str, str]] = []
    if isinstance(raw, Mapping):
        raw = list(raw.items())
    if isinstance(raw, list):
        for item in raw:
            if (
                isinstance(item, (list, tuple))
                and len(item) == 2
                and all(isinstance(part, str) for part in item)
            ):
                pairs.append((item[0], item[1]))
    return pairs


class UndeliveredEvents:
    """Recovers undelivered webhooks through the events API into ``inbox``."""

    def __init__(
        self,
        api: EventsApi,
        inbox: Store,
        secrets: Iterable[Secret],
        merchant_id: str,
        *,
        resend: bool = False,
        page_size: int = 100,
        max_requests: int = 1_000,
        account: str = DEFAULT_ACCOUNT,
        accounts: AccountSource | None = None,
    ) -> None:
        """``max_requests`` bounds a run's requests on this path: the listing and the
        attempts fetched for each undelivered event together. ``account``: the processor
        account ``merchant_id`` and ``secrets`` are (what it recovers is stored in it);
        ``accounts``: the installation's, which tell which events are its (default: the
        accounts stored in hookledger's table)."""
        self.api = api
        self.account = account
        self.inbox = inbox
        #: The account's local states (what waits in the inbox), read as the lists read them.
        self._local = ReconcileStore(inbox.engine, account=account)
        self.secrets = tuple(secrets)
        if not self.secrets:
            raise ValueError("verifying recovered webhooks needs the webhook secrets")
        if not merchant_id:
            raise ValueError("the events API needs the merchant id (HOOKLEDGER_MERCHANT_ID)")
        self.merchant_id = merchant_id
        self.resend = resend
        self.page_size = page_size
        self.max_requests = max_requests
        self.accounts: AccountSource = (
            accounts if accounts is not None else StoredAccounts(inbox.accounts)
        )
        #: The rule of the run in progress (read afresh by each run).
        self._ownership: Ownership | None = None
        #: Where the earlier system's history ends on this account (read by each run).
        self._ends: datetime | None = None

    def __repr__(self) -> str:
        return f"UndeliveredEvents(merchant_id={self.merchant_id!r}, resend={self.resend})"

    def run(self, start: datetime, end: datetime, report: EventsReport, *, dry_run: bool) -> None:
        cutover = self.inbox.operations.cutover(account=self.account)
        ends = self._ends = cutover.history_ends if cutover is not None else None
        ownership = self._ownership = Ownership(self.account, self.accounts)
        pager = self.api.iter_events(
            self.merchant_id,
            start,
            end,
            is_delivered=False,
            page_size=self.page_size,
            max_requests=self.max_requests,
            on_stuck="report",
            profile_id=ownership.profile_filter,
        )
        self._spent = 0
        self._pager = pager
        self._left_over = 0
        batch: list[tuple[str, datetime | None]] = []
        try:
            for item in pager:
                report.listed += 1
                event_id = item.get("event_id") if isinstance(item, Mapping) else None
                problem = clean_text(event_id)
                if problem is not None:
                    report.bad_rows += 1
                    _note(
                        report.bad_rows_sample, f"event {escape_id(event_id)}: event_id {problem}"
                    )
                    continue
                assert isinstance(event_id, str)
                if not ownership.owns_object(item):
                    report.other_profiles[ownership.profile_of(item)] += 1
                    continue
                created = parse_timestamp(item.get("created"))
                # Where the earlier system's history ends, as the guard and the watermarks
                # judge it (the first delivery, when the deploy came before adoption): what
                # happened after the deploy was sent to hookledger, whenever adoption ran.
                if ends is not None and created is not None and created < ends:
                    report.before_cutover += 1
                    continue
                batch.append((event_id, created))
                if len(batch) >= BATCH:
                    self._recover(batch, report, dry_run)
                    batch = []
            self._recover(batch, report, dry_run)
        except ProcessorError as exc:
            report.remote_errors.append(f"{type(exc).__name__}: {exc}")
            log.error("listing undelivered events failed: %s", type(exc).__name__)
        finally:
            report.requests += pager.requests
            if self._left_over:
                report.incomplete.append(
                    f"the request budget of {self.max_requests} was spent: {self._left_over} "
                    "undelivered event(s) left for the next run"
                )
            report.incomplete += [
                f"{w.start.isoformat()}..{w.end.isoformat()}: {w.reason}" for w in pager.incomplete
            ]
            for problem_row in getattr(pager, "row_errors", ()):
                report.bad_rows += 1
                _note(
                    report.bad_rows_sample,
                    f"event {problem_row.object_id or '(no id)'}: {problem_row.reason}",
                )

    def _stored(self, event_ids: Sequence[str]) -> set[str]:
        with self.inbox.deferred.connect() as conn:
            rows = conn.execute(
                select(E.c.event_id).where(
                    E.c.account == self.account, E.c.event_id.in_(list(event_ids))
                )
            )
            return {row.event_id for row in rows}

    def _known(self, event: Event) -> bool:
        """Whether hookledger already holds the transition ``event`` stands for: dispatched
        (its owner in the transition ledger, as the guard reads it) or waiting in the inbox
        (an open event of the object reporting the same state).

        A state adoption recorded as seen, that the object still stands at, is not held
        when ``event`` shows it happening after the earlier system's history ended (a
        dispute won between the deploy and adoption): the guard dispatches the event."""
        ref = event.object_ref
        if ref is None:
            return False
        state = read_event(ref.kind, event.event_type, ref.status, ref.stage).state
        if state is None:
            return False
        sql = self.inbox.storage.sql
        with self.inbox.deferred.connect() as conn:
            key = (self.account, ref.kind, ref.object_id, state.key)
            owner = sql.transition_owners(conn, {key}).get(key)
            if owner is not None:
                ends = self._ends
                if (
                    owner != ADOPTED
                    or ends is None
                    or event.timestamp is None
                    or as_utc(event.timestamp) < ends
                ):
                    return True
                rows = sql.projections(conn, {(self.account, ref.kind, ref.object_id)})
                return not any(
                    row.event_pk == ADOPTED
                    and make_state(ref.kind, row.status, row.stage).key == state.key
                    for row in rows
                )
        waiting = self._local.waiting_states(ref.kind, [ref.object_id])
        return state in waiting.get(ref.object_id, ())

    def _recover(
        self, events: list[tuple[str, datetime | None]], report: EventsReport, dry_run: bool
    ) -> None:
        if not events:
            return
        stored = self._stored([event_id for event_id, _ in events])
        for event_id, created in events:
            if event_id in stored:
                report.already_stored += 1
                continue
            if self._pager.requests + self._spent >= self.max_requests:
                self._left_over += 1
                continue
            self._spent += 1
            report.requests += 1
            attempts = self.api.event_attempts(self.merchant_id, event_id)
            self._one(event_id, created, attempts, report, dry_run)

    def _one(
        self,
        event_id: str,
        created: datetime | None,
        attempts: list[dict[str, Any]],
        report: EventsReport,
        dry_run: bool,
    ) -> None:
        shown = escape_id(event_id)
        request = initial_request(attempts) if isinstance(attempts, list) else None
        raw_body = request.get("body") if request is not None else None
        if raw_body is None and isinstance(attempts, list):
            # Listed before its request was recorded (a delivery interrupted mid-way): not
            # yet, like a queued event. A later run finds it again (see the watermark).
            report.note_waiting(
                f"event {shown}: no stored request yet (a later run fetches it)", created
            )
            return
        if not isinstance(raw_body, str):
            report.bad_rows += 1
            _note(report.bad_rows_sample, f"event {shown}: no stored request body")
            return
        try:
            body = raw_body.encode("utf-8")
        except UnicodeEncodeError:
            report.bad_rows += 1
            _note(report.bad_rows_sample, f"event {shown}: the stored body is not UTF-8")
            return
        headers = header_pairs(request.get("headers") if request is not None else None)
        signature = next(
            (value for name, value in headers if name.lower() == SIGNATURE_HEADER.lower()), None
        )
        try:
            secret_id = verify(body, signature, self.secrets)
        except SignatureError as exc:
            report.bad_signature += 1
            _note(report.bad_signature_sample, f"event {shown}: {exc.message}")
            log.warning(
                "undelivered event not stored: its signature does not verify",
                extra={"action": "bad_signature", "event_id": event_id},
            )
            return
        try:
            event = parse_event(body)
        except MalformedEvent as exc:
            report.bad_rows += 1
            _note(report.bad_rows_sample, f"event {shown}: {exc.message}")
            return
        if event.event_id != event_id:
            report.bad_rows += 1
            _note(report.bad_rows_sample, f"event {shown}: its stored body carries another id")
            return
        if self._ownership is not None and not self._ownership.owns(
            event.merchant_id, event.profile_id
        ):
            # Listed as this account's, yet its body names another profile: not stored.
            report.other_profiles[event.profile_id or NO_PROFILE] += 1
            return
        known = self._known(event)
        if dry_run:
            if known:
                report.already_known += 1
            else:
                report.recovered[event.event_type] += 1
            return
        result = self.inbox.inbox.insert(
            event,
            body,
            headers=headers,
            secret_id=secret_id,
            source=Source.RECOVERED,
            account=self.account,
        )
        if result.result == "inserted" and known:
            report.already_known += 1
        elif result.result == "inserted":
            report.recovered[event.event_type] += 1
        elif result.result == "duplicate":
            report.already_stored += 1
        else:
            report.bad_rows += 1
            _note(report.bad_rows_sample, f"event {shown}: stored before with another body")
        if self.resend and self._pager.requests + self._spent < self.max_requests:
            self._spent += 1
            try:
                self.api.retry_event(self.merchant_id, event_id)
                report.resent += 1
            except ProcessorError as exc:
                report.remote_errors.append(f"re-send of {shown}: {type(exc).__name__}")
            report.requests += 1
