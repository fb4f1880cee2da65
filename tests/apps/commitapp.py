"""A shop whose handlers manage the session the usual SQLAlchemy way (issue 28, hole 1).

``ship`` writes the shipment and calls ``session.commit()``, as a shop used to its own
sessions would; ``reserve`` uses the idempotency pattern (``except IntegrityError:
session.rollback()``). Configured only from the environment, for a real ``worker --burst``.
"""

from __future__ import annotations

import sqlalchemy as sa
from flask import Flask
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from receiver import Event, WebhookReceiver

hooks = WebhookReceiver()

SHIPMENT_TABLE = "commit_shipment"
RESERVATION_TABLE = "commit_reservation"


@hooks.on("payment_succeeded", name="ship")
def ship(event: Event, session: Session) -> None:
    session.execute(
        sa.text(f"INSERT INTO {SHIPMENT_TABLE} (event_id) VALUES (:e)"), {"e": event.event_id}
    )
    session.commit()


@hooks.on("payment_succeeded", "refund_succeeded", name="reserve")
def reserve(event: Event, session: Session) -> None:
    ref = event.object_ref
    try:
        session.execute(
            sa.text(f"INSERT INTO {RESERVATION_TABLE} (object_id) VALUES (:o)"),
            {"o": ref.object_id if ref else event.event_id},
        )
        session.flush()
    except IntegrityError:
        session.rollback()  # reserved before: nothing to do


def create_app() -> Flask:
    app = Flask(__name__)
    hooks.init_app(app)
    return app


def create_shop_tables(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE {SHIPMENT_TABLE} (event_id VARCHAR(255) NOT NULL)"))
        conn.execute(
            sa.text(f"CREATE TABLE {RESERVATION_TABLE} (object_id VARCHAR(255) PRIMARY KEY)")
        )
