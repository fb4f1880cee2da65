"""Typed, immutable webhook events parsed from Hyperswitch bodies (pure, no I/O).

A Hyperswitch webhook body is
``{"merchant_id", "event_id", "event_type", "content": {"type", "object"}, "timestamp"}``
(see ``hyperswitch-facts.md`` section 2). :func:`parse_event` validates the *envelope* only:
the body must be a UTF-8 JSON object with a usable ``event_id``. Everything else is parsed
leniently: an unknown ``event_type`` or content type, unknown fields, or a field of the wrong
type never raise (the wrong-typed field becomes ``None``), because the receiver stores every
authentic event, even one it does not understand. The whole parsed dict is kept in ``raw``.

The typed resources an event carries live in :mod:`receiver.core.resources` (their ``repr``
never shows card data), the lenient field readers in :mod:`receiver.core.fields`.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import MappingProxyType
from typing import Any, Final, TypeVar, cast

from receiver.core.accounts import DEFAULT_ACCOUNT
from receiver.core.errors import MalformedEvent, UnknownEventType
from receiver.core.fields import parse_timestamp as parse_timestamp
from receiver.core.fields import read_datetime, read_mapping, read_str
from receiver.core.resources import (
    RESOURCE_TYPES,
    Dispute,
    Invoice,
    Mandate,
    Payment,
    Payout,
    Reference,
    Refund,
    Resource,
    Subscription,
    parse_resource,
    reference_of,
)
from receiver.core.status import CONTENT_TYPE_KIND, STATUS_FOR_EVENT

__all__ = [
    "CONTENT_TYPES",
    "CONTENT_TYPE_FOR_CLASS",
    "EVENT_CLASSES",
    "EVENT_TYPES",
    "MAX_EVENT_ID_LENGTH",
    "RESOURCE_TYPES",
    "Dispute",
    "Event",
    "Invoice",
    "Mandate",
    "ObjectRef",
    "Payment",
    "Payout",
    "Refund",
    "Resource",
    "Subscription",
    "parse_event",
    "validate_event_type",
]

#: Event classes (Hyperswitch ``EventClass``), in the processor's order.
EVENT_CLASSES: Final = ("payments", "refunds", "disputes", "mandates", "payouts", "subscriptions")

#: Content types (``content.type``, Hyperswitch ``EventObjectType``).
CONTENT_TYPES: Final = (
    "payment_details",
    "refund_details",
    "dispute_details",
    "mandate_details",
    "payout_details",
    "subscription_details",
)

#: The content type an event of each class carries.
CONTENT_TYPE_FOR_CLASS: Final[Mapping[str, str]] = MappingProxyType(
    dict(zip(EVENT_CLASSES, CONTENT_TYPES, strict=True))
)

#: All 29 Hyperswitch event types to their event class.
EVENT_TYPES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "payment_succeeded": "payments",
        "payment_failed": "payments",
        "payment_processing": "payments",
        "payment_cancelled": "payments",
        "payment_cancelled_post_capture": "payments",
        "payment_authorized": "payments",
        "payment_partially_authorized": "payments",
        "payment_captured": "payments",
        "payment_expired": "payments",
        "action_required": "payments",
        "refund_succeeded": "refunds",
        "refund_failed": "refunds",
        "dispute_opened": "disputes",
        "dispute_expired": "disputes",
        "dispute_accepted": "disputes",
        "dispute_cancelled": "disputes",
        "dispute_challenged": "disputes",
        "dispute_won": "disputes",
        "dispute_lost": "disputes",
        "mandate_active": "mandates",
        "mandate_revoked": "mandates",
        "payout_success": "payouts",
        "payout_failed": "payouts",
        "payout_initiated": "payouts",
        "payout_processing": "payouts",
        "payout_cancelled": "payouts",
        "payout_expired": "payouts",
        "payout_reversed": "payouts",
        "invoice_paid": "subscriptions",
    }
)

#: Longest accepted ``event_id`` (Hyperswitch sends ``evt_`` + 32 hex characters).
MAX_EVENT_ID_LENGTH: Final = 255


_R = TypeVar("_R", Payment, Refund, Dispute, Mandate, Payout, Subscription)


# --------------------------------------------------------------------------------------------
# Events
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The object an event is about: its kind, id, the status the event reports and, for a
    dispute, its stage."""

    kind: str
    object_id: str
    status: str | None
    stage: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Event:
    """A parsed webhook event.

    Only the envelope is validated (see :func:`parse_event`); the content is parsed leniently
    into a typed resource (``object``), which is ``None`` for a missing or unknown content
    type. ``raw`` is the whole parsed body.

    An event read from a body (:meth:`from_dict`, :func:`parse_event`) builds its ``object``
    when it is first read: the receive path needs only :attr:`object_ref`,
    :attr:`profile_id` and :attr:`object_created_time`, read straight from the content
    (:class:`receiver.core.resources.Reference`), and leaves the typed parse to the handlers.
    Equality, ``repr``, ``replace`` and pickling read ``object`` like any field.
    """

    event_id: str
    event_type: str
    event_class: str | None = None
    merchant_id: str | None = None
    timestamp: datetime | None = None
    content_type: str | None = None
    object: Resource | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)
    #: The processor account the event belongs to (:mod:`receiver.core.accounts`): set by
    #: the worker from the stored row (the body does not say; ``merchant_id`` is the
    #: processor's id, not the account's).
    account: str = DEFAULT_ACCOUNT

    @property
    def profile_id(self) -> str | None:
        """The business profile of the event's object, when its content names one."""
        reference = self._reference()
        return reference.profile_id if reference is not None else None

    @property
    def object_created_time(self) -> datetime | None:
        """When the processor created the event's object (its ``created_time``), if known."""
        reference = self._reference()
        return reference.created_time if reference is not None else None

    def _reference(self) -> Reference | None:
        """The object's reference, read from the content while ``object`` is not built."""
        stored = _OBJECT_SLOT.__get__(self, Event)
        if type(stored) is _Unparsed:
            return stored.reference()
        return None if stored is None else Reference.of(stored)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Event:
        """Build an event from a parsed body; raises :class:`MalformedEvent` on a bad envelope.

        The envelope needs a non-empty string ``event_id`` of at most 255 characters. An
        unknown ``event_type`` (a missing or non-string one becomes ``""``), an unknown or
        missing content type and unknown fields are accepted.
        """
        if not isinstance(data, Mapping):
            raise MalformedEvent(f"webhook body must be a JSON object, not {json_type(data)}")
        event_id = data.get("event_id")
        if event_id is None:
            raise MalformedEvent("webhook body has no event_id")
        if not isinstance(event_id, str):
            raise MalformedEvent(f"event_id must be a string, not {json_type(event_id)}")
        if not event_id.strip():
            raise MalformedEvent("event_id is empty")
        if len(event_id) > MAX_EVENT_ID_LENGTH:
            raise MalformedEvent(
                f"event_id is {len(event_id)} characters long (at most {MAX_EVENT_ID_LENGTH})"
            )
        event_type = read_str(data.get("event_type")) or ""
        content = read_mapping(data.get("content")) or {}
        content_type = read_str(content.get("type"))
        obj = read_mapping(content.get("object"))
        return cls(
            event_id=event_id,
            event_type=event_type,
            event_class=EVENT_TYPES.get(event_type),
            merchant_id=read_str(data.get("merchant_id")),
            timestamp=read_datetime(data.get("timestamp")),
            content_type=content_type,
            # Built when first read (see the class docstring).
            object=cast(Any, _Unparsed(content_type, obj))
            if obj is not None and content_type is not None and content_type in RESOURCE_TYPES
            else None,
            raw=data,
        )

    def for_account(self, account: str) -> Event:
        """``replace(self, account=account)``, its object left unparsed if it is: ``replace``
        reads every field, and reading ``object`` builds the typed resource, which the
        receive path (that files a delivery under the account it came to) never reads."""
        copy = replace(self, object=None, account=account)
        _OBJECT_SLOT.__set__(copy, _OBJECT_SLOT.__get__(self, Event))
        return copy

    @property
    def is_known(self) -> bool:
        """True when ``event_type`` is one of the 29 Hyperswitch event types."""
        return self.event_type in EVENT_TYPES

    @property
    def kind(self) -> str | None:
        """The object kind of the content type (``payment``, ..., ``invoice``), else ``None``."""
        if self.content_type is None:
            return None
        return CONTENT_TYPE_KIND.get(self.content_type)

    @property
    def object_ref(self) -> ObjectRef | None:
        """Kind, id and status of the object; ``None`` without a typed object or a non-empty id.

        When the object carries no status, the status the event type implies is used
        (``receiver.core.status.STATUS_FOR_EVENT``), provided the event type is about that kind.
        """
        stored = _OBJECT_SLOT.__get__(self, Event)
        if type(stored) is _Unparsed:
            return stored.object_ref(self.event_type)
        return _object_ref(None if stored is None else Reference.of(stored), self.event_type)

    def _expect(self, resource_type: type[_R], content_type: str) -> _R:
        if isinstance(self.object, resource_type):
            return self.object
        if self.object is None and self.content_type == content_type:
            actual = f"{content_type!r} content without an object"
        else:
            actual = f"content type {self.content_type!r}"
        raise AttributeError(
            f"event {self.event_id} ({self.event_type or 'no event_type'}) carries {actual}, "
            f"not {content_type!r}"
        )

    @property
    def payment(self) -> Payment:
        """The payment; ``AttributeError`` when the content is not ``payment_details``."""
        return self._expect(Payment, "payment_details")

    @property
    def refund(self) -> Refund:
        """The refund; ``AttributeError`` when the content is not ``refund_details``."""
        return self._expect(Refund, "refund_details")

    @property
    def dispute(self) -> Dispute:
        """The dispute; ``AttributeError`` when the content is not ``dispute_details``."""
        return self._expect(Dispute, "dispute_details")

    @property
    def mandate(self) -> Mandate:
        """The mandate; ``AttributeError`` when the content is not ``mandate_details``."""
        return self._expect(Mandate, "mandate_details")

    @property
    def payout(self) -> Payout:
        """The payout; ``AttributeError`` when the content is not ``payout_details``."""
        return self._expect(Payout, "payout_details")

    @property
    def subscription(self) -> Subscription:
        """The subscription; ``AttributeError`` when the content is not ``subscription_details``."""
        return self._expect(Subscription, "subscription_details")


def _object_ref(reference: Reference | None, event_type: str) -> ObjectRef | None:
    """:attr:`Event.object_ref` of an object's ``reference`` in an event of ``event_type``."""
    if reference is None:
        return None
    object_id = reference.object_id
    if object_id is None or not object_id.strip():
        return None
    status = reference.status
    if status is None:
        implied = STATUS_FOR_EVENT.get(event_type)
        if implied is not None and implied[0] == reference.kind:
            status = implied[1]
    return ObjectRef(kind=reference.kind, object_id=object_id, status=status, stage=reference.stage)


class _Unparsed:
    """An event's ``content.object`` whose typed resource is not built yet: its content
    type (one of :data:`RESOURCE_TYPES`) and mapping, and its reference once read.

    Its :class:`ObjectRef` is kept too, with the event type it was made for (the status it
    falls back on depends on it): the receive path reads it twice, to check the event is
    storable and to build its inbox row."""

    __slots__ = ("content_type", "data", "_reference", "_object_ref")

    def __init__(self, content_type: str, data: Mapping[str, Any]) -> None:
        self.content_type = content_type
        self.data = data
        self._reference: Reference | None = None
        self._object_ref: tuple[str, ObjectRef | None] | None = None

    def reference(self) -> Reference | None:
        if self._reference is None:
            self._reference = reference_of(self.content_type, self.data)
        return self._reference

    def object_ref(self, event_type: str) -> ObjectRef | None:
        kept = self._object_ref
        if kept is not None and kept[0] == event_type:
            return kept[1]
        ref = _object_ref(self.reference(), event_type)
        self._object_ref = (event_type, ref)
        return ref

    def __repr__(self) -> str:
        return f"<{self.content_type} not parsed yet>"


class _LazyObject:
    """:attr:`Event.object`: the slot's value, the typed resource built (and stored in the
    slot) the first time an event read from a body is asked for it. Two threads reading it
    at once may both build it: equal values, the last one kept."""

    def __init__(self, slot: Any) -> None:
        self._slot = slot

    def __get__(self, instance: Event | None, owner: type | None = None) -> Any:
        if instance is None:
            return self
        stored = self._slot.__get__(instance, owner)
        if type(stored) is _Unparsed:
            stored = parse_resource(stored.content_type, stored.data)
            self._slot.__set__(instance, stored)
        return stored

    def __set__(self, instance: Event, value: Any) -> None:
        self._slot.__set__(instance, value)

    def __delete__(self, instance: Event) -> None:
        self._slot.__delete__(instance)


#: The member descriptor of ``Event``'s ``object`` slot (the value as stored).
_OBJECT_SLOT: Any = Event.__dict__["object"]
setattr(Event, "object", _LazyObject(_OBJECT_SLOT))  # noqa: B010 - replaces the slot's descriptor


def json_type(value: object) -> str:
    """The JSON type of a decoded value, as a noun phrase (``"an object"``, ``"null"``...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, Mapping):
        return "an object"
    return f"a {type(value).__name__}"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


#: ``json.loads(text, parse_constant=...)`` makes a decoder per call; one serves every call.
_DECODER: Final = json.JSONDecoder(parse_constant=_reject_constant)


def parse_event(body: bytes) -> Event:
    """Parse a raw webhook body into an :class:`Event`.

    Raises :class:`MalformedEvent` when the body is not UTF-8, not JSON (``NaN`` and
    ``Infinity`` included), not a JSON object, nested too deeply to parse, or has no usable
    ``event_id`` (missing, not a string, empty or longer than 255 characters).
    """
    try:
        text = bytes(body).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedEvent(
            f"webhook body is not valid UTF-8 (bad byte at position {exc.start})"
        ) from None
    try:
        data = _DECODER.decode(text)
    except RecursionError:
        raise MalformedEvent("webhook body is nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise MalformedEvent(
            f"webhook body is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    except ValueError as exc:
        raise MalformedEvent(f"webhook body is not valid JSON: {exc}") from None
    event = Event.from_dict(data)
    _check_storable(event)
    return event


def _check_storable(event: Event) -> None:
    """Refuse text no database column can hold: NUL characters (PostgreSQL rejects them) and
    unpaired surrogates (from JSON escapes like ``\\ud800``; not encodable as UTF-8)."""
    ref = event.object_ref
    fields = (
        ("event_id", event.event_id),
        ("event_type", event.event_type),
        ("merchant_id", event.merchant_id),
        ("content.type", event.content_type),
        ("object id", ref.object_id if ref else None),
        ("object status", ref.status if ref else None),
        ("dispute stage", ref.stage if ref else None),
    )
    for name, value in fields:
        if value is None:
            continue
        if "\x00" in value:
            raise MalformedEvent(f"{name} contains a NUL character")
        if value.isascii():
            continue  # ASCII holds no surrogate: not encoded to tell
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise MalformedEvent(f"{name} contains an unpaired surrogate escape") from None


def validate_event_type(name: str) -> str:
    """Return ``name`` if it is a Hyperswitch event type, else raise :class:`UnknownEventType`.

    The error suggests the closest event type ("did you mean ...?") when one is close.
    """
    if isinstance(name, str) and name in EVENT_TYPES:
        return name
    if not isinstance(name, str):
        raise UnknownEventType(f"event type must be a string, not {type(name).__name__}")
    probe = name.strip().lower().replace(".", "_").replace("-", "_").replace(" ", "_")
    # Prefer an event type of the same family (``payout_succeeded`` -> ``payout_success``,
    # not ``payment_succeeded``), then any close one.
    family = [known for known in EVENT_TYPES if known.split("_")[0] == probe.split("_")[0]]
    matches = difflib.get_close_matches(probe, family, n=1, cutoff=0.6)
    matches = matches or difflib.get_close_matches(probe, list(EVENT_TYPES), n=1, cutoff=0.6)
    hint = f"; did you mean {matches[0]!r}?" if matches else ""
    raise UnknownEventType(f"unknown event type {name!r}{hint}")
