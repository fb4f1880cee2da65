"""Signals (blinker, as Flask's own): alert, count or page in your own way.

Connect a receiver to any of these; it is called in the process where the thing happened
(the web process for ``event_received``/``event_rejected``/``event_conflict``, the worker for
the dispatch signals, the reconciler's process for ``reconcile_finished``), after the
change is committed, with keyword arguments only::

    import receiver.core.signals as signals

    @signals.event_dead_lettered.connect
    def page(sender, **info):
        pager.notify(f"dead letter {info['event_id']} ({info['event_type']}): {info['reason']}")

The sender is the Flask app when an application context is active (the web process,
``hookledger worker``), else ``None``; connect without a sender (as above) to receive every
one. Every event signal carries ``event_id``, ``event_type`` and ``account`` (the processor
account, :mod:`receiver.core.accounts`; on ``event_rejected`` ``None`` when the delivery was
refused before its account was known); no signal carries a body,
a header, a secret or card data. A receiver that raises is logged and ignored: it never
fails a delivery or a dispatch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from blinker import Namespace, Signal

log = logging.getLogger("receiver.signals")

_signals = Namespace()

#: A delivery was stored (webhook). ``result``: ``inserted``, ``duplicate`` or ``conflict``;
#: also ``source`` and ``secret_id`` (the id of the secret that verified it, never the secret).
event_received: Signal = _signals.signal("hookledger.event-received")
#: A delivery was refused. ``reason``: ``bad_signature`` (401), ``too_large`` (413),
#: ``malformed`` (400), ``too_old`` (400, older than ``HOOKLEDGER_MAX_EVENT_AGE``): the
#: request's fault; ``storage_unavailable`` (503): the database's, only then;
#: ``storage_busy`` (503): the database answered, but a lock stayed held past the wait
#: (another writer's; not an outage). ``status``: the
#: HTTP status answered; ``code``: the error code answered (``HL_01``...).
event_rejected: Signal = _signals.signal("hookledger.event-rejected")
#: An event id arrived again with a different body (kept, flagged). ``source``.
event_conflict: Signal = _signals.signal("hookledger.event-conflict")
#: An event's handlers all succeeded. ``handlers`` (names run), ``source``,
#: ``latency_seconds`` (from receipt to done), ``attempts``.
event_dispatched: Signal = _signals.signal("hookledger.event-dispatched")
#: A handler raised. ``handler``, ``error`` (the exception), ``attempts``, ``will_retry``.
handler_failed: Signal = _signals.signal("hookledger.handler-failed")
#: A handler finished (any outcome). ``handler``, ``status`` (``succeeded``, ``failed``,
#: ``deferred``), ``duration_seconds``.
handler_finished: Signal = _signals.signal("hookledger.handler-finished")
#: An event was dead-lettered (out of attempts, deferred past the limit, unparseable, or
#: its worker lost on every attempt). ``reason``, ``attempts``.
event_dead_lettered: Signal = _signals.signal("hookledger.event-dead-lettered")
#: The guard recorded an event stale (it would move its object backwards). ``reason``.
event_stale: Signal = _signals.signal("hookledger.event-stale")
#: The guard recorded an event duplicate (its transition was dispatched already). ``reason``.
event_duplicate: Signal = _signals.signal("hookledger.event-duplicate")
#: A reconcile run finished (sent by :mod:`reconcile`, never by the receiver). ``status``
#: (``ok``, ``unresolved``, ``incomplete``, ``dry_run``, ``failed``), ``report`` (the
#: report's dict, as stored in ``hookledger_recon_run.report``), ``run_id``.
reconcile_finished: Signal = _signals.signal("hookledger.reconcile-finished")

ALL: tuple[Signal, ...] = (
    event_received,
    event_rejected,
    event_conflict,
    event_dispatched,
    handler_failed,
    handler_finished,
    event_dead_lettered,
    event_stale,
    event_duplicate,
    reconcile_finished,
)


def _no_sender() -> Any:
    return None


#: Finds the sender of a signal sent without one. The Flask side installs one that answers the
#: current app (:mod:`receiver.web.state`); the core knows no framework.
_find_sender: Callable[[], Any] = _no_sender


def set_sender_finder(finder: Callable[[], Any]) -> None:
    """Install how :func:`default_sender` finds the sender (the Flask side does, on import)."""
    global _find_sender
    _find_sender = finder


def default_sender() -> Any:
    """The current Flask app when an application context is active, else ``None``."""
    return _find_sender()


def send(signal: Signal, sender: Any = None, /, **info: Any) -> None:
    """Send ``signal`` (when anyone listens); a receiver that raises is logged, never raised:
    alerting must not break receiving or dispatching."""
    if not signal.receivers:
        return
    if sender is None:
        sender = default_sender()
    for receiver in signal.receivers_for(sender):
        try:
            receiver(sender, **info)
        except Exception:  # noqa: BLE001 - a merchant's receiver may raise anything
            log.exception(
                "a %s receiver failed",
                getattr(signal, "name", "signal"),
                extra={
                    "action": "signal_failed",
                    "event_id": info.get("event_id"),
                    "event_type": info.get("event_type"),
                },
            )


__all__ = [
    "ALL",
    "event_conflict",
    "event_dead_lettered",
    "event_dispatched",
    "event_duplicate",
    "event_received",
    "event_rejected",
    "event_stale",
    "handler_failed",
    "handler_finished",
    "reconcile_finished",
    "send",
]


def rejected(exc: Exception, account: str | None = None) -> None:
    """Send :data:`event_rejected` for a refused delivery (from the receive view), under
    the reason its error class declares (``signal_reason``, one per code): nothing falls
    through to ``storage_unavailable``."""
    send(
        event_rejected,
        reason=str(getattr(exc, "signal_reason", "rejected")),
        status=getattr(exc, "http_status", 500),
        code=getattr(exc, "code", None),
        account=account,
    )


def received(event: Any, result: str, secret_id: str | None) -> None:
    """Send :data:`event_received` (and :data:`event_conflict` for a conflicting body) for a
    stored delivery (from the receive view, after the commit)."""
    if not event_received.receivers and not (result == "conflict" and event_conflict.receivers):
        return  # nobody listens: not even the signals' fields are gathered
    info = {
        "event_id": event.event_id,
        "event_type": event.event_type,
        "source": "webhook",
        "account": getattr(event, "account", None),
    }
    send(event_received, **info, result=result, secret_id=secret_id)
    if result == "conflict":
        send(event_conflict, **info)
