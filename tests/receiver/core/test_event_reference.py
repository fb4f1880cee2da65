"""An event read from a body builds its typed ``object`` only when asked; the receive path
reads the object's reference straight from the content. Both readings must agree for any
body, or the inbox row (object key, status, stage, creation time) and the account routing
(profile) would differ from what the worker and the handlers see."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from receiver.core.events import RESOURCE_TYPES, Dispute, Event, ObjectRef, Payment, parse_event
from receiver.core.resources import Reference, parse_resource
from receiver.core.status import REFUND_STATUS_ALIASES, STATUS_FOR_EVENT

#: The content keys any resource reads for its reference, and some it does not.
KEYS = (
    "payment_id",
    "refund_id",
    "dispute_id",
    "mandate_id",
    "payout_id",
    "id",
    "status",
    "dispute_status",
    "dispute_stage",
    "profile_id",
    "created",
    "created_at",
    "amount",
    "invoice",
    "payment",
)

TEXT = st.sampled_from(
    ["", " ", "pay_1", "re_2", "dp_3", "pro_1", "succeeded", "pre_arbitration", "x\x00y"]
    + sorted(REFUND_STATUS_ALIASES)
)
STATUS = st.sampled_from(
    sorted(REFUND_STATUS_ALIASES)
    + sorted({status for _, status in STATUS_FOR_EVENT.values()})
    + ["", "pre_arbitration", "dispute"]
)
WHEN = st.sampled_from(
    ["2026-01-02T03:04:05Z", "2026-01-02T03:04:05", "2026-01-02T03:04:05+05:30", "soon", ""]
)
SCALAR = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), TEXT, WHEN
)
JSON_VALUE = st.recursive(
    SCALAR,
    lambda inner: st.one_of(
        st.lists(inner, max_size=2),
        st.dictionaries(st.sampled_from(KEYS), inner, max_size=4),
    ),
    max_leaves=6,
)


@st.composite
def content_objects(draw: st.DrawFn) -> dict[str, Any]:
    """A ``content.object``: each key read for a reference present or not, mostly with a
    value of its kind (an id, a status in either refund spelling, a timestamp), sometimes
    of another type; nested objects too (a subscription's invoice)."""
    obj: dict[str, Any] = {}
    for key in KEYS:
        if not draw(st.booleans()):
            continue
        if key.endswith("_id") or key == "id":
            kind = TEXT
        elif key in ("status", "dispute_status", "dispute_stage"):
            kind = STATUS
        elif key.startswith("created"):
            kind = WHEN
        elif key in ("invoice", "payment"):
            kind = st.deferred(lambda: content_objects())
        else:
            kind = JSON_VALUE
        obj[key] = draw(st.one_of(kind, kind, JSON_VALUE))
    return obj


CONTENT_OBJECT = content_objects()
EVENT_TYPE = st.one_of(st.sampled_from(sorted(STATUS_FOR_EVENT)), st.sampled_from(["", "x"]))
CONTENT_TYPE = st.one_of(st.none(), st.sampled_from([*RESOURCE_TYPES, "unknown_details"]))


def _body(event_type: str, content_type: str | None, obj: Any) -> bytes:
    content: dict[str, Any] = {"object": obj}
    if content_type is not None:
        content["type"] = content_type
    return json.dumps(
        {
            "merchant_id": "merchant_1",
            "event_id": "evt_1",
            "event_type": event_type,
            "content": content,
            "timestamp": "2026-01-02T03:04:05Z",
        }
    ).encode()


def _typed(event: Event) -> tuple[ObjectRef | None, str | None, datetime | None]:
    """The reference as the typed resource gives it (the receive path's reading before
    events built their object lazily)."""
    resource = event.object
    if resource is None:
        return None, None, None
    profile = getattr(resource, "profile_id", None)
    created = resource.created_time
    object_id = resource.object_id
    if object_id is None or not object_id.strip():
        return None, profile if isinstance(profile, str) else None, created
    status = resource.status
    if status is None:
        implied = STATUS_FOR_EVENT.get(event.event_type)
        if implied is not None and implied[0] == resource.kind:
            status = implied[1]
    stage = resource.dispute_stage if isinstance(resource, Dispute) else None
    ref = ObjectRef(kind=resource.kind, object_id=object_id, status=status, stage=stage)
    return ref, profile if isinstance(profile, str) else None, created


@settings(max_examples=600, deadline=None)
@given(EVENT_TYPE, CONTENT_TYPE, CONTENT_OBJECT)
def test_the_reference_read_from_the_content_is_the_typed_resources(
    event_type: str, content_type: str | None, obj: dict[str, Any]
) -> None:
    body = _body(event_type, content_type, obj)
    lazy = Event.from_dict(json.loads(body))
    read = (lazy.object_ref, lazy.profile_id, lazy.object_created_time)
    typed = _typed(Event.from_dict(json.loads(body)))
    assert read == typed
    # Once built, the event answers from the typed resource: the same again.
    assert (lazy.object_ref, lazy.profile_id, lazy.object_created_time) == read
    resource = parse_resource(content_type, obj)
    assert lazy.object == resource
    if resource is not None:
        reference = RESOURCE_TYPES[content_type].reference(obj)  # type: ignore[index]
        assert reference == Reference.of(resource)


def test_the_typed_object_is_built_when_first_read_and_then_kept() -> None:
    body = _body("payment_succeeded", "payment_details", {"payment_id": "pay_1", "amount": 5})
    event = parse_event(body)
    assert event.object_ref == ObjectRef("payment", "pay_1", "succeeded")
    first = event.object
    assert isinstance(first, Payment) and first.amount == 5
    assert event.object is first
    assert event.payment is first


def test_a_lazy_event_equals_copies_replaces_and_pickles_like_a_built_one() -> None:
    body = _body("refund_succeeded", "refund_details", {"refund_id": "re_1", "status": "success"})
    built = parse_event(body)
    assert built.object is not None  # built now
    lazy = parse_event(body)
    assert lazy == built and parse_event(body) == parse_event(body)
    assert repr(parse_event(body)) == repr(built)
    moved = dataclasses.replace(parse_event(body), account="acct_2")
    assert moved.object == built.object and moved.account == "acct_2"
    assert pickle.loads(pickle.dumps(parse_event(body))) == built
    assert copy.deepcopy(parse_event(body)) == built
    assert dataclasses.asdict(parse_event(body))["object"]["status"] == "succeeded"


def test_an_event_built_by_hand_reads_its_reference_from_its_object() -> None:
    created = datetime(2026, 1, 2, tzinfo=UTC)
    event = Event(
        event_id="evt_1",
        event_type="payment_failed",
        content_type="payment_details",
        object=Payment(payment_id="pay_9", profile_id="pro_1", created=created),
    )
    assert event.object_ref == ObjectRef("payment", "pay_9", "failed")
    assert (event.profile_id, event.object_created_time) == ("pro_1", created)
    assert Event(event_id="evt_2", event_type="x").object_ref is None
