"""Property-based tests of the receive path with hostile input, on the real app and real HMAC.

Every request goes through Flask's test client into the real blueprint (the ``make_app``
fixture, SQLite or PostgreSQL), with ``PROPAGATE_EXCEPTIONS`` on, so an exception escaping the
blueprint fails the test instead of turning into a 500. The properties:

- never a 5xx and never an escaping exception, whatever the body, headers or encoding;
- an unverified request (missing, malformed, wrong, duplicated signature; a body changed after
  signing) gets 401 and never adds a row (inbox and conflict rows are counted before/after);
- a validly signed body gets 200 when it is a JSON object with a usable ``event_id`` and 400
  otherwise, and a 400 adds no row;
- a validly signed, well-formed event gets 200 and exactly one new row, whatever the content
  type, extra headers, header-name case, signature case or secret (primary or previous);
- a body over the cap gets 413, without being read when its length is declared;
- the worker can drain whatever was accepted without an exception escaping it.

One database per test function (hypothesis examples share it; row-count deltas are compared).
"""

from __future__ import annotations

import io
import itertools
import json
import string
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from werkzeug.test import TestResponse

from receiver import Event, WebhookReceiver
from receiver.core.events import EVENT_TYPES
from receiver.core.signature import SIGNATURE_HEADER, sign
from receiver.storage.tables import InboxEvent
from receiver.testing.factories import OMIT, build_event, encode
from tests.conftest import SECRETS, AppFactory
from tests.reliability._inproc import Counts, row_counts, strict_app

pytestmark = pytest.mark.storage

PRIMARY = SECRETS["primary"]
PREVIOUS = SECRETS["previous"]
URL = "/webhooks/"
SMALL_CAP = 4096

SETTINGS = settings(
    max_examples=50,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)

#: Unique event id suffixes (fixed width, so a body's length never depends on the counter and
#: hypothesis sees the same draws when it replays an example).
_ids = itertools.count()

# -- strategies ---------------------------------------------------------------------------------

#: Text for fields the receiver copies into columns. Lone surrogates and NUL are left out here;
#: they have targeted tests below (known package bugs, see test_known_bug_*).
safe_text = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=30
)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | safe_text
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(safe_text, inner, max_size=4),
    max_leaves=12,
)
#: Any header value the test client can send (it refuses CR and LF), non-ASCII included.
any_header_value = st.text(
    alphabet=st.characters(exclude_characters="\r\n"), max_size=300
) | st.builds(
    lambda ch, n: ch * n,
    st.characters(exclude_characters="\r\n"),
    st.integers(min_value=1_000, max_value=200_000),
)
#: What a real WSGI server can hand over as a header value: latin-1 decoded bytes, no CR/LF.
wire_header_value = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"),
    max_size=60,
)
header_name = st.text(alphabet=string.ascii_letters + string.digits + "-", min_size=1, max_size=24)
content_types = st.one_of(
    st.none(),
    st.sampled_from(
        [
            "application/json",
            "application/json; charset=utf-8",
            "application/json; charset=utf-16",
            "text/plain",
            "application/octet-stream",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=xyz",
            "application/xml",
            "",
        ]
    ),
    wire_header_value,
)
timestamps = st.datetimes(
    min_value=datetime(1, 1, 2),
    max_value=datetime(9999, 12, 30),
    timezones=st.just(UTC)
    | st.builds(
        lambda minutes: timezone(timedelta(minutes=minutes)),
        st.integers(min_value=-14 * 60, max_value=14 * 60),
    ),
)


@st.composite
def well_formed_events(draw: st.DrawFn) -> dict[str, Any]:
    """A Hyperswitch-shaped event of any of the 29 types with random but valid fields."""
    event_type = draw(st.sampled_from(sorted(EVENT_TYPES)))
    fields: dict[str, Any] = {}
    if draw(st.booleans()):
        fields["metadata"] = draw(st.dictionaries(safe_text, safe_text, max_size=4))
    if draw(st.booleans()):
        fields["amount"] = draw(st.integers(min_value=0, max_value=10**15))
    if draw(st.booleans()):
        fields["description"] = draw(safe_text)
    object_id = draw(st.none() | st.text(string.ascii_letters + string.digits + "_", min_size=1))
    event = build_event(
        event_type,
        object_id=object_id,
        event_id="placeholder",
        timestamp=draw(
            st.datetimes(
                min_value=datetime(2000, 1, 1),
                max_value=datetime(2200, 1, 1),
                timezones=st.just(UTC),
            )
        ),
        merchant_id=draw(st.text(string.ascii_letters + "_", min_size=1, max_size=40)),
        **fields,
    )
    prefix = draw(st.text(string.ascii_letters + string.digits + "_-", max_size=40))
    event["event_id"] = f"evt_{prefix}_{next(_ids):012d}"
    if draw(st.booleans()):
        event["timestamp"] = draw(timestamps).isoformat()
    return event


def _signature_forms(body: bytes) -> st.SearchStrategy[str | None]:
    """Signature header values that must not verify ``body`` (``None``: header missing)."""
    good = sign(body, PRIMARY)
    return st.one_of(
        st.none(),
        any_header_value,
        st.text(alphabet="0123456789abcdefABCDEF", min_size=128, max_size=128),
        st.text(alphabet="0123456789abcdef", max_size=300).filter(lambda s: len(s) != 128),
        st.just(sign(body, "not-the-secret")),
        st.just(sign(body + b" ", PRIMARY)),
        st.just("sha512=" + good),
        st.just(good[:-1]),
        st.just(good + "0"),
        st.just(good[:64]),
        st.just(good.encode().hex()),
        st.just(" ".join(good)),
    )


@st.composite
def byte_mutations(draw: st.DrawFn, original: bytes) -> bytes:
    data = bytearray(original)
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "dup", "swap"]))
        at = draw(st.integers(min_value=0, max_value=max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[at] ^= 1 << draw(st.integers(min_value=0, max_value=7))
        elif op == "set" and data:
            data[at] = draw(st.integers(min_value=0, max_value=255))
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and data:
            del data[at : at + draw(st.integers(min_value=1, max_value=8))]
        elif op == "truncate":
            del data[at:]
        elif op == "dup" and data:
            data[at:at] = data[at : at + draw(st.integers(min_value=1, max_value=16))]
        elif op == "swap" and len(data) > 1:
            other = draw(st.integers(min_value=0, max_value=len(data) - 1))
            data[at], data[other] = data[other], data[at]
    return bytes(data)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _paths(value, prefix + (index,))


EVENT_ID_EDGES: list[Any] = [
    None,
    "",
    "   ",
    "\t\n",
    "e" * 255,
    "e" * 256,
    "é" * 255,
    12,
    1.5,
    True,
    ["evt_1"],
    {"id": "evt_1"},
]


@st.composite
def field_mutations(draw: st.DrawFn, original: dict[str, Any]) -> Any:
    """``original`` with 1-3 values replaced, retyped, deleted or added anywhere in the tree."""
    doc: Any = json.loads(json.dumps(original))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        op = draw(st.sampled_from(["replace", "delete", "add", "retype", "event_id"]))
        if op == "event_id" and isinstance(doc, dict):
            edge = draw(st.sampled_from(range(len(EVENT_ID_EDGES))))
            doc["event_id"] = EVENT_ID_EDGES[edge]
            continue
        path = draw(st.sampled_from(list(_paths(doc))))
        if not path:
            if op == "replace":
                doc = draw(json_values)
            continue
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        last = path[-1]
        if op == "replace":
            parent[last] = draw(json_values)
        elif op == "retype":
            value = parent[last]
            retyped: list[Any] = [str(value), [value], {"value": value}, None]
            parent[last] = retyped[draw(st.integers(min_value=0, max_value=3))]
        elif op == "delete":
            del parent[last]
        elif isinstance(parent, dict):
            parent[draw(safe_text)] = draw(json_values)
        else:
            parent.insert(int(last), draw(json_values))
    return doc


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _doc_of(body: bytes) -> Any:
    """The JSON document ``body`` holds for a strict UTF-8 JSON parser, or ``None``."""
    try:
        return json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None


def _poisoned(node: Any) -> bool:
    """Whether a string anywhere in ``node`` holds NUL or a lone surrogate (known bugs)."""
    if isinstance(node, str):
        return "\x00" in node or any("\ud800" <= ch <= "\udfff" for ch in node)
    if isinstance(node, dict):
        return any(_poisoned(k) or _poisoned(v) for k, v in node.items())
    if isinstance(node, list):
        return any(_poisoned(v) for v in node)
    return False


def _expected_ok(doc: Any) -> bool:
    """What the README promises for a validly signed JSON document: 200 or 400."""
    if not isinstance(doc, dict):
        return False
    event_id = doc.get("event_id")
    return isinstance(event_id, str) and bool(event_id.strip()) and len(event_id) <= 255


# -- fixtures and helpers -------------------------------------------------------------------


class Receiver:
    """The app under test, its engine and the drain check shared by every test."""

    def __init__(self, app: Flask) -> None:
        self.app = strict_app(app)
        self.client = app.test_client()
        self.state = WebhookReceiver.state(app)
        self.engine: sa.Engine = self.state.store.engine

    def counts(self) -> Counts:
        return row_counts(self.engine)

    def post(
        self,
        body: bytes | None,
        headers: Sequence[tuple[str, str]] | dict[str, str] = (),
        **kwargs: Any,
    ) -> TestResponse:
        if body is not None:
            kwargs["data"] = body
        response = self.client.post(URL, headers=list(_items(headers)), **kwargs)
        assert response.status_code < 500, response.get_data()[:300]
        return response

    def post_signed(
        self, body: bytes, secret: str = PRIMARY, extra: Sequence[tuple[str, str]] = ()
    ) -> TestResponse:
        headers = [(SIGNATURE_HEADER, sign(body, secret)), ("Content-Type", "application/json")]
        return self.post(body, headers + list(extra))

    def drain_ok(self) -> int:
        """Run every accepted event through the worker; nothing may escape it."""
        return self.state.worker(name="bad-input").drain()


def _items(headers: Sequence[tuple[str, str]] | dict[str, str]) -> Iterator[tuple[str, str]]:
    yield from headers.items() if isinstance(headers, dict) else headers


def _touch(event: Event) -> None:
    """A catch-all handler that reads the typed views of whatever was accepted."""
    repr(event)
    ref = event.object_ref
    if ref is not None:
        repr(ref)
    if event.object is not None:
        repr(event.object)


@pytest.fixture
def receiver(make_app: AppFactory) -> Receiver:
    hooks = WebhookReceiver()
    hooks.on_any(name="touch")(_touch)
    app, _ = make_app(hooks)
    return Receiver(app)


@pytest.fixture
def capped(make_app: AppFactory) -> Receiver:
    app, _ = make_app(max_body_bytes=SMALL_CAP)
    return Receiver(app)


def _check_signed(receiver: Receiver, doc: Any, body: bytes) -> None:
    """Post ``body`` (the encoding of ``doc``) validly signed; check status and row deltas."""
    before = receiver.counts()
    response = receiver.post_signed(body)
    after = receiver.counts()
    if not _expected_ok(doc):
        assert response.status_code == 400, (response.status_code, body[:200])
        assert after == before
        return
    assert response.status_code == 200, (response.get_data()[:300], body[:200])
    result = response.get_json()["status"]
    if result == "inserted":
        assert after == Counts(before.inbox + 1, before.conflicts)
    elif result == "duplicate":
        assert after == before
    else:  # a conflict is kept once per distinct body
        assert result == "conflict", result
        assert after.inbox == before.inbox
        assert after.conflicts - before.conflicts in (0, 1)


# -- unverified requests ----------------------------------------------------------------------


@SETTINGS
@given(data=st.data())
def test_random_bodies_with_bad_signatures_get_401_and_no_row(
    receiver: Receiver, data: st.DataObject
) -> None:
    body = data.draw(
        st.binary(max_size=3000)
        | well_formed_events().map(encode)
        | st.builds(lambda v: json.dumps(v).encode(), json_values),
        label="body",
    )
    signature = data.draw(_signature_forms(body), label="signature")
    headers = [] if signature is None else [(SIGNATURE_HEADER, signature)]
    content_type = data.draw(content_types, label="content type")
    if content_type is not None:
        headers.append(("Content-Type", content_type))
    before = receiver.counts()
    response = receiver.post(body, headers)
    assert response.status_code == 401, response.get_data()[:300]
    assert response.get_json()["error"]["code"] == "HL_01"
    assert receiver.counts() == before
    receiver.drain_ok()


@SETTINGS
@given(data=st.data())
def test_signed_bodies_changed_after_signing_get_401_and_no_row(
    receiver: Receiver, data: st.DataObject
) -> None:
    original = encode(data.draw(well_formed_events(), label="event"))
    mutated = data.draw(byte_mutations(original), label="mutated")
    assume(mutated != original)
    before = receiver.counts()
    response = receiver.post(mutated, {SIGNATURE_HEADER: sign(original, PRIMARY)})
    assert response.status_code == 401
    assert receiver.counts() == before


@SETTINGS
@given(
    values=st.lists(
        st.sampled_from(["valid", "valid_upper", "other_body", "garbage", "previous"]),
        min_size=2,
        max_size=4,
    ),
    event=well_formed_events(),
    name_case=st.sampled_from([str.lower, str.upper, str.title, lambda s: s]),
)
def test_duplicated_signature_headers_never_store_unverified(
    receiver: Receiver, values: list[str], event: dict[str, Any], name_case: Callable[[str], str]
) -> None:
    body = encode(event)
    forms = {
        "valid": sign(body, PRIMARY),
        "valid_upper": sign(body, PRIMARY).upper(),
        "previous": sign(body, PREVIOUS),
        "other_body": sign(body + b"x", PRIMARY),
        "garbage": "zz" * 64,
    }
    headers = [(name_case(SIGNATURE_HEADER), forms[v]) for v in values]
    before = receiver.counts()
    response = receiver.post(body, headers)
    after = receiver.counts()
    # A repeated header reaches the app as one comma-joined value, never a valid signature.
    assert response.status_code == 401
    assert after == before


# -- validly signed input ---------------------------------------------------------------------


@SETTINGS
@given(data=st.data())
def test_signed_byte_mutations_get_200_or_400_never_5xx(
    receiver: Receiver, data: st.DataObject
) -> None:
    original = encode(data.draw(well_formed_events(), label="event"))
    mutated = data.draw(byte_mutations(original), label="mutated")
    doc = _doc_of(mutated)
    assume(not _poisoned(doc))  # NUL and lone surrogates: see the known-bug tests below
    _check_signed(receiver, doc, mutated)
    receiver.drain_ok()


@SETTINGS
@given(data=st.data())
def test_signed_field_mutations_follow_the_readme(receiver: Receiver, data: st.DataObject) -> None:
    doc = data.draw(field_mutations(data.draw(well_formed_events(), label="event")), label="doc")
    _check_signed(receiver, doc, encode(doc) if isinstance(doc, dict) else json.dumps(doc).encode())
    receiver.drain_ok()


@SETTINGS
@given(
    event=well_formed_events(),
    secret=st.sampled_from([PRIMARY, PREVIOUS]),
    upper=st.booleans(),
    pad=st.sampled_from(["", " ", "\t", "  "]),
    name_case=st.sampled_from([str.lower, str.upper, str.title, lambda s: s]),
    content_type=content_types,
    extra=st.lists(st.tuples(header_name, wire_header_value), max_size=5),
    credentials=st.lists(
        st.tuples(st.sampled_from(["Authorization", "Cookie", "api-key"]), wire_header_value),
        max_size=3,
    ),
)
def test_well_formed_signed_events_get_200_and_exactly_one_row(
    receiver: Receiver,
    event: dict[str, Any],
    secret: str,
    upper: bool,
    pad: str,
    name_case: Callable[[str], str],
    content_type: str | None,
    extra: list[tuple[str, str]],
    credentials: list[tuple[str, str]],
) -> None:
    body = encode(event)
    signature = sign(body, secret)
    reserved = {"content-type", "content-length", "host", "transfer-encoding"}
    reserved.add(SIGNATURE_HEADER.lower())
    headers = [(name_case(SIGNATURE_HEADER), pad + (signature.upper() if upper else signature))]
    if content_type is not None:
        headers.append(("Content-Type", content_type))
    headers += [(k, v) for k, v in extra + credentials if k.lower() not in reserved]
    before = receiver.counts()
    response = receiver.post(body, headers)
    assert response.status_code == 200, response.get_data()[:300]
    assert response.get_json() == {"status": "inserted", "event_id": event["event_id"]}
    assert receiver.counts() == Counts(before.inbox + 1, before.conflicts)
    stored = receiver.state.store.operations.get(event["event_id"])
    assert stored is not None and bytes(stored.body) == body
    assert stored.secret_id == ("primary" if secret == PRIMARY else "previous")
    kept = {k.lower() for k in json.loads(stored.headers)}
    assert not kept & {"authorization", "cookie", "api-key"}
    # The processor's retry of the same delivery: 200, no new row.
    again = receiver.post(body, headers)
    assert again.get_json()["status"] == "duplicate"
    assert receiver.counts() == Counts(before.inbox + 1, before.conflicts)
    receiver.drain_ok()


# -- encodings --------------------------------------------------------------------------------

ENCODINGS: list[tuple[str, Callable[[str], bytes]]] = [
    ("utf-8-bom", lambda text: b"\xef\xbb\xbf" + text.encode("utf-8")),
    ("utf-16", lambda text: text.encode("utf-16")),
    ("utf-16-le", lambda text: text.encode("utf-16-le")),
    ("utf-16-be", lambda text: text.encode("utf-16-be")),
    ("utf-32", lambda text: text.encode("utf-32")),
    ("latin-1", lambda text: text.encode("latin-1", errors="replace")),
    ("cp1252", lambda text: text.encode("cp1252", errors="replace")),
    ("shift-jis", lambda text: text.encode("shift_jis", errors="replace")),
    ("cesu-8-surrogate", lambda text: text.encode("utf-8").replace(b"evt_", b"evt_\xed\xa0\x80")),
    ("overlong-slash", lambda text: text.encode("utf-8").replace(b"evt_", b"evt_\xc0\xaf")),
    ("stray-continuation", lambda text: text.encode("utf-8") + b"\x80"),
]


@SETTINGS
@given(
    event=well_formed_events(),
    encoding=st.sampled_from(ENCODINGS),
    note=st.text(alphabet="éüßøå日本語€ abc", min_size=1, max_size=20),
)
def test_signed_non_utf8_bodies_get_400_and_no_row(
    receiver: Receiver,
    event: dict[str, Any],
    encoding: tuple[str, Callable[[str], bytes]],
    note: str,
) -> None:
    event["content"]["object"]["description"] = note
    name, encode_as = encoding
    body = encode_as(encode(event).decode("utf-8"))
    before = receiver.counts()
    response = receiver.post_signed(body)
    after = receiver.counts()
    if name == "utf-8-bom" and response.status_code == 200:
        # RFC 8259 lets a parser ignore a BOM; then it is the one event it claims to be.
        assert after == Counts(before.inbox + 1, before.conflicts)
    elif _doc_of(body) is None:
        assert response.status_code == 400, (name, response.get_data()[:200])
        assert response.get_json()["error"]["code"] == "HL_04"
        assert after == before
    else:  # every character survived the encoding as ASCII: it is plain UTF-8 after all
        assert response.status_code == 200
        assert after == Counts(before.inbox + 1, before.conflicts)
    receiver.drain_ok()


# -- size and nesting -------------------------------------------------------------------------


def test_bodies_over_the_default_cap_get_413_even_when_signed(receiver: Receiver) -> None:
    cap = receiver.state.settings.max_body_bytes
    event = build_event("payment_succeeded", event_id="evt_huge_1")
    event["content"]["object"]["metadata"] = {"pad": "x"}
    body = encode(event)
    padding = cap + 1 - len(body)
    event["content"]["object"]["metadata"] = {"pad": "x" * (1 + padding)}
    huge = encode(event)
    assert len(huge) == cap + 1
    before = receiver.counts()
    for headers in (
        {SIGNATURE_HEADER: sign(huge, PRIMARY)},
        {SIGNATURE_HEADER: "0" * 128},
        {},
    ):
        response = receiver.post(huge, headers)
        assert response.status_code == 413
        assert response.get_json()["error"]["code"] == "HL_13"
    ten_mib = b"[" * (10 * 1024 * 1024)
    assert receiver.post(ten_mib, {SIGNATURE_HEADER: sign(ten_mib, PRIMARY)}).status_code == 413
    assert receiver.counts() == before
    # One byte less is an ordinary, stored event.
    event["content"]["object"]["metadata"] = {"pad": "x" * padding}
    assert receiver.post_signed(encode(event)).status_code == 200
    assert receiver.counts() == Counts(before.inbox + 1, before.conflicts)


class CountingStream(io.BytesIO):
    """A request body that tells how far the app read into it (whatever read method it used)."""

    @property
    def consumed(self) -> int:
        return self.tell()


@SETTINGS
@given(
    extra=st.integers(min_value=-40, max_value=40),
    chunked=st.booleans(),
    sign_it=st.booleans(),
)
def test_the_cap_boundary_and_unread_oversized_bodies(
    capped: Receiver, extra: int, chunked: bool, sign_it: bool
) -> None:
    event = build_event("refund_succeeded", event_id=f"evt_cap_{next(_ids):012d}")
    event["content"]["object"]["metadata"] = {"pad": ""}
    base = len(encode(event))
    size = SMALL_CAP + extra
    event["content"]["object"]["metadata"] = {"pad": "y" * (size - base)}
    body = encode(event)
    assert len(body) == size
    stream = CountingStream(body)
    headers = {SIGNATURE_HEADER: sign(body, PRIMARY) if sign_it else "f" * 128}
    before = capped.counts()
    if chunked:  # no Content-Length: the app must stop reading after cap + 1 bytes
        response = capped.post(
            None,
            headers,
            input_stream=stream,
            environ_overrides={"wsgi.input_terminated": True, "CONTENT_LENGTH": ""},
        )
    else:
        response = capped.post(None, headers, input_stream=stream)
    after = capped.counts()
    if size > SMALL_CAP:
        assert response.status_code == 413
        assert after == before
        assert stream.consumed <= (SMALL_CAP + 1 if chunked else 0)
    elif sign_it:
        assert response.status_code == 200
        assert after == Counts(before.inbox + 1, before.conflicts)
    else:
        assert response.status_code == 401
        assert after == before


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda n: b"[" * n + b"]" * n, id="arrays"),
        pytest.param(lambda n: b'{"a":' * n + b"1" + b"}" * n, id="objects"),
        pytest.param(lambda n: b'[{"a":' * n + b"1" + b"}]" * n, id="mixed"),
        pytest.param(lambda n: b"[" * n, id="unclosed"),
        pytest.param(
            lambda n: b'{"event_id":"evt_deep","content":' + b"[" * n + b"]" * n + b"}",
            id="inside-an-event",
        ),
    ],
)
def test_signed_deeply_nested_json_gets_400(
    receiver: Receiver, build: Callable[[int], bytes]
) -> None:
    before = receiver.counts()
    for depth in (100_000, 20_000):
        body = build(depth)
        response = receiver.post_signed(body)
        assert response.status_code == 400, response.get_data()[:200]
        assert response.get_json()["error"]["code"] == "HL_04"
    assert receiver.counts() == before


@settings(SETTINGS, max_examples=25)
@given(depth=st.integers(min_value=1, max_value=2500), where=st.sampled_from(["meta", "top"]))
def test_signed_nesting_of_any_depth_is_200_or_400_and_drains(
    receiver: Receiver, depth: int, where: str
) -> None:
    event = build_event("payment_succeeded", event_id=f"evt_nest_{next(_ids):012d}")
    marker = "__NEST__"
    if where == "meta":
        event["content"]["object"]["metadata"] = {"deep": marker}
    else:
        event["deep"] = marker
    body = encode(event).replace(json.dumps(marker).encode(), b"[" * depth + b"{}" + b"]" * depth)
    before = receiver.counts()
    response = receiver.post_signed(body)
    after = receiver.counts()
    if response.status_code == 200:
        assert after == Counts(before.inbox + 1, before.conflicts)
    else:
        assert response.status_code == 400
        assert after == before
    receiver.drain_ok()


def test_everything_accepted_drains_to_a_terminal_status(receiver: Receiver) -> None:
    """Odd but acceptable events (unknown types and contents, sparse bodies) reach the worker
    and end done, stale or duplicate, never stuck in processing."""
    odd: list[Any] = [
        {"event_id": "evt_only_id"},
        {"event_id": "evt_unknown_type", "event_type": "payment_teleported", "content": {}},
        {"event_id": "evt_content_list", "event_type": "payment_succeeded", "content": [1, 2]},
        {
            "event_id": "evt_object_str",
            "event_type": "refund_succeeded",
            "content": {"type": "refund_details", "object": "ref_1"},
        },
        {
            "event_id": "evt_mismatch",
            "event_type": "payment_succeeded",
            "content": {"type": "dispute_details", "object": {"dispute_id": 7}},
        },
        {"event_id": "evt_bad_ts", "timestamp": "0000-00-00T99:99:99Z", "event_type": 12},
        build_event("payment_succeeded", event_id="evt_far_future", timestamp=datetime(9999, 1, 1)),
        build_event("payment_failed", event_id="evt_far_past", timestamp=datetime(1, 1, 2)),
        build_event("dispute_opened", event_id="evt_no_status", status=OMIT, amount=10**20),
    ]
    for doc in odd:
        _check_signed(receiver, doc, encode(doc))
    assert receiver.drain_ok() >= len(odd)
    with receiver.engine.connect() as conn:
        table: sa.Table = InboxEvent.__table__  # type: ignore[attr-defined]
        statuses = {row.status for row in conn.execute(sa.select(table.c.status))}
    assert statuses <= {"done", "stale", "duplicate"}, statuses


# -- regressions: text no column can hold once escaped the blueprint as a 500 -----------------


@pytest.mark.parametrize("where", ["event_id", "status", "event_type"])
def test_lone_surrogate_escape_is_a_400_not_a_500(receiver: Receiver, where: str) -> None:
    event = build_event("payment_succeeded", event_id="evt_surrogate")
    if where == "status":
        event["content"]["object"]["status"] = "\ud800"
    else:
        event[where] = event[where] + "\ud800"
    body = json.dumps(event).encode("ascii")  # the escape is plain ASCII on the wire
    before = receiver.counts()
    response = receiver.post_signed(body)
    assert response.status_code == 400
    assert receiver.counts().inbox == before.inbox


@pytest.mark.parametrize("where", ["event_id", "event_type", "payment_id", "merchant_id"])
def test_nul_escape_is_a_400_not_a_500(receiver: Receiver, where: str) -> None:
    event = build_event("payment_succeeded", event_id="evt_nul")
    if where == "payment_id":
        event["content"]["object"]["payment_id"] = "pay_\x00"
    else:
        event[where] = event[where] + "\x00"
    body = json.dumps(event).encode("ascii")
    before = receiver.counts()
    response = receiver.post_signed(body)
    assert response.status_code == 400
    assert receiver.counts().inbox == before.inbox
