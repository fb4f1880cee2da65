"""The order index's backfill beside the other data-at-rest commands, on one inbox.

``python -m bench.order_backfill [--events 100000] [--backend sqlite|postgresql]``: a fresh
database, ``events`` deliveries stored through the package's own write path (sealed with a
data key, each with its own ``metadata.order_id``; the reconciler's batch insert, a
thousand a transaction), their order index emptied (as before migration 0009), then timed
one after the other on the same rows, each as its command runs it (the default batch
sizes):

- ``order-index backfill`` (every event opened, parsed, its references digested, its rows
  replaced);
- a search of one order (``events --order``) and its notes, on the full index;
- ``rotate-keys`` to a new primary (every body, header and hash sealed again, and the order
  index keyed again from the bodies);
- ``redact`` (every event finished: bodies dropped, index rows deleted).

It prints events per second for each. Not part of ``./run bench``: the data-at-rest
commands have no target of their own; this compares the backfill with them.
"""

from __future__ import annotations

import argparse
import base64
import time
from datetime import timedelta
from pathlib import Path

import sqlalchemy as sa

from bench.common import Backend, database, log, migrate, temp_dir

KEY1 = base64.b64encode(b"1" * 32).decode()
KEY2 = base64.b64encode(b"2" * 32).decode()


def _fill(url: str, events: int) -> None:
    from receiver.core.events import parse_event
    from receiver.core.keyring import parse_data_keys
    from receiver.storage.database import make_engine
    from receiver.store import Store
    from receiver.testing.factories import build_event, encode

    engine = make_engine(url)
    store = Store(engine, keyring=parse_data_keys(f"k1:{KEY1}"))
    try:
        for start in range(0, events, 1000):
            batch = []
            for i in range(start, min(events, start + 1000)):
                body = encode(
                    build_event(
                        "payment_succeeded",
                        event_id=f"evt_{i:032x}",
                        object_id=f"pay_{i:020x}",
                        metadata={"order_id": f"ord-{i}"},
                    )
                )
                batch.append((parse_event(body), body))
            store.inbox.insert_synthesised(batch)
    finally:
        engine.dispose()


def run(backend: Backend, events: int, workdir: Path) -> list[str]:
    from receiver.atrest.order_index import OrderIndex
    from receiver.core.keyring import parse_data_keys
    from receiver.storage.database import make_engine
    from receiver.storage.operator_reads import EventQuery, list_events
    from receiver.storage.order_search import search_notes
    from receiver.storage.sql.tables import EVENT, ORDER_REF
    from receiver.store import Store

    lines: list[str] = []
    with database(backend, workdir, "orders") as db:
        migrate(db)
        log(f"order index on {db.label}: storing {events:,} events")
        started = time.monotonic()
        _fill(db.url, events)
        lines.append(
            f"{db.label}: {events:,} events stored (write path, indexed at insert) in "
            f"{time.monotonic() - started:.1f} s"
        )
        engine = make_engine(db.url)
        try:
            with engine.begin() as conn:
                conn.execute(sa.delete(ORDER_REF))
                if backend == "postgresql":
                    conn.execute(sa.text("ANALYZE"))
            store = Store(engine, keyring=parse_data_keys(f"k1:{KEY1}"))

            def timed(label: str, work: object) -> float:
                began = time.monotonic()
                assert callable(work)
                work()
                seconds = time.monotonic() - began
                lines.append(
                    f"{db.label}: {label}: {seconds:.2f} s ({events / seconds:,.0f} events/s)"
                )
                log(lines[-1])
                return seconds

            report = None

            def backfill() -> None:
                nonlocal report
                report = OrderIndex(store.storage).backfill()

            timed("order-index backfill (batches of 500)", backfill)
            assert report is not None and report.complete and report.events == events
            began = time.monotonic()
            page = list_events(
                engine, EventQuery(order=f"ord-{events // 2}"), keyring=store.keyring
            )
            found = time.monotonic() - began
            began = time.monotonic()
            notes = search_notes(engine, store.keyring, store.storage.order_fields)
            noted = time.monotonic() - began
            assert len(page.rows) == 1 and not notes
            lines.append(
                f"{db.label}: one order found in {found * 1000:.1f} ms; the search's notes "
                f"(a scan of the index's keys) {noted * 1000:.1f} ms"
            )
            rotated = Store(engine, keyring=parse_data_keys(f"k2:{KEY2},k1:{KEY1}"))
            timed(
                "rotate-keys to a new primary (batches of 200; the order index keyed again)",
                lambda: rotated.rotation.run(),
            )
            with engine.begin() as conn:
                conn.execute(sa.update(EVENT).values(status="done"))
            later = rotated.now() + timedelta(days=40)
            rotated.clock = lambda: later
            timed(
                "redact (batches of 500; index rows deleted with the bodies)",
                lambda: rotated.retention.redact(timedelta(days=30)),
            )
        finally:
            engine.dispose()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument(
        "--backend", action="append", choices=["sqlite", "postgresql"], dest="backends"
    )
    args = parser.parse_args()
    lines: list[str] = []
    with temp_dir() as workdir:
        for backend in args.backends or ["sqlite", "postgresql"]:
            lines += run(backend, args.events, workdir)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
