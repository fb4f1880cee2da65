from __future__ import annotations

import json

from receiver.testing.factories import build_event
from tests.conftest import AppFactory
from tests.receiver.cli.test_order_story import _app, _cli, _post


def _raw(event_id: str, object_id: str, metadata_json: str) -> bytes:
    ev = build_event("payment_succeeded", event_id=event_id, object_id=object_id, metadata={"order_id": "PLACEHOLDER"})
    text = json.dumps(ev)
    return text.replace('"PLACEHOLDER"', metadata_json).encode()


def test_edge(make_app: AppFactory) -> None:
    app = _app(make_app)
    cases = {
        "huge_int": "1" + "0" * 5000,
        "big_int": "123456789012345678901234567890",
        "float": "1234.0",
        "bool": "true",
        "nested": '{"id": "1234"}',
        "list": '["1234"]',
        "null": "null",
        "unicode": json.dumps("café\u0301 ☃"),
        "surrogate": '"\\ud800abc"',
        "long": json.dumps("x" * 100000),
        "neg": "-5",
        "exp": "1e3",
    }
    for i, (name, val) in enumerate(cases.items()):
        r = _post(app, _raw(f"evt_{name}", f"pay_{i}", val))
        print(name, r)
    for q in ["1" + "0" * 5000, "123456789012345678901234567890", "1234.0", "1234", "café\u0301 ☃", "-5", "1e3", "1000", "x" * 100000]:
        res = _cli(app, "events", "--order", q, "--json")
        print(q[:30], res.exit_code, res.stdout[:200].replace("\n"," "), res.stderr[:200])
    res = _cli(app, "events", "--order", "\ud800abc", "--json")
    print("surrogate", res.exit_code, res.stdout[:200], res.stderr[:300], res.exception)
