"""The shop's Flask app: orders, plus hookledger's webhook blueprint at /webhooks/.

Run it (see the Procfile)::

    web:    gunicorn 'examples.shop.app:create_app()'
    worker: hookledger --app examples.shop.app:create_app worker

Settings come from the environment: HOOKLEDGER_SECRETS, HOOKLEDGER_DATABASE_URL (shared by
the shop's orders and hookledger's inbox, so handlers commit with the ledger), and, to take
payments, HOOKLEDGER_PROCESSOR_URL and HOOKLEDGER_API_KEY (the sandbox's, for example).
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import click
from flask import Flask, abort, jsonify, render_template_string, request
from sqlmodel import Session, SQLModel, select

from examples.shop.handlers import hooks
from examples.shop.models import Order
from receiver import WebhookReceiver
from receiver import db as hookledger_db
from reconcile.client import ProcessorClient

PAGE = """<!doctype html><title>Shop orders</title>
<h1>Orders</h1><table border=1 cellpadding=4>
<tr><th>order</th><th>amount</th><th>status</th><th>payment</th><th>message</th></tr>
{% for o in orders %}<tr><td>{{o.id}}</td><td>{{o.amount}} {{o.currency}}</td>
<td>{{o.status}}</td><td>{{o.payment_id or ''}}</td><td>{{o.failure_message or ''}}</td></tr>
{% endfor %}</table>"""


def _engine(app: Flask) -> Any:
    return WebhookReceiver.state(app).store.engine


def order_dict(order: Order) -> dict[str, Any]:
    return order.model_dump(mode="json")


def _setting(app: Flask, key: str) -> Any:
    return app.config.get(key) or os.environ.get(key)


def _ops(app: Flask) -> None:
    """hookledger's metrics and ops console, each mounted when its access rule is set: both
    refuse to start without one."""
    if _setting(app, "HOOKLEDGER_METRICS_TOKEN"):
        from receiver.metrics import Metrics

        Metrics(app)  # GET /metrics, "Authorization: Bearer <HOOKLEDGER_METRICS_TOKEN>"
    if _setting(app, "HOOKLEDGER_CONSOLE_PASSWORD"):
        from receiver.console import Console

        app.secret_key = _setting(app, "SHOP_SECRET_KEY") or app.secret_key
        if not app.secret_key:
            raise RuntimeError("set SHOP_SECRET_KEY: the console's CSRF tokens need it")
        Console(app)  # /hookledger/, user "ops", password HOOKLEDGER_CONSOLE_PASSWORD


def create_app(config: dict[str, Any] | None = None) -> Flask:
    app = Flask(__name__)
    app.config.update(config or {})
    hooks.init_app(app)
    _ops(app)

    @app.cli.command("init-db")
    def init_db() -> None:
        """Apply hookledger's migrations and create the shop's tables."""
        engine = _engine(app)
        hookledger_db.upgrade(engine)
        SQLModel.metadata.create_all(engine, tables=[Order.__table__])  # type: ignore[attr-defined]
        click.echo("shop database ready")

    @app.get("/")
    def index() -> str:
        with Session(_engine(app)) as session:
            orders = session.exec(select(Order).order_by(Order.id)).all()
        return render_template_string(PAGE, orders=orders)

    @app.get("/orders")
    def list_orders() -> Any:
        with Session(_engine(app)) as session:
            orders = session.exec(select(Order).order_by(Order.id)).all()
        return jsonify([order_dict(o) for o in orders])

    @app.get("/orders/<order_id>")
    def get_order(order_id: str) -> Any:
        with Session(_engine(app)) as session:
            order = session.get(Order, order_id)
            if order is None:
                abort(404)
            return jsonify(order_dict(order))

    @app.post("/orders")
    def create_order() -> Any:
        """Create an order; with a processor configured, also create and confirm its payment.

        The checkout confirms server-side and feeds the processor's response through
        hookledger (``hooks.observe(..., dispatch=True)``): a payment that succeeded at once
        is shipped in this request, by the same handler and the same transition-once rule as
        the webhook, which then finds it done. Any other outcome is left to the events.
        """
        data = request.get_json(force=True, silent=True) or {}
        try:
            amount = int(data["amount"])
        except (KeyError, TypeError, ValueError):
            return jsonify({"error": "amount (integer, lowest unit) is required"}), 400
        order = Order(
            id=str(data.get("id") or f"ord_{uuid.uuid4().hex[:12]}"),
            amount=amount,
            currency=str(data.get("currency") or "USD"),
        )
        with Session(_engine(app)) as session:
            session.add(order)
            session.commit()
            session.refresh(order)
        base_url = os.environ.get("HOOKLEDGER_PROCESSOR_URL")
        api_key = os.environ.get("HOOKLEDGER_API_KEY")
        card = data.get("card")
        if base_url and api_key and card:
            payment = _pay(base_url, api_key, order, str(card))
            with Session(_engine(app)) as session:
                stored = session.get(Order, order.id)
                assert stored is not None
                stored.payment_id = payment.get("payment_id")
                session.add(stored)
                session.commit()
            # The API response goes through the same gate as the webhook: if it says
            # succeeded, the order ships now, exactly once.
            hooks.observe(payment, dispatch=True)
            with Session(_engine(app)) as session:
                shipped = session.get(Order, order.id)
                assert shipped is not None
                return jsonify(order_dict(shipped)), 201
        return jsonify(order_dict(order)), 201

    return app


def _pay(base_url: str, api_key: str, order: Order, card: str) -> dict[str, Any]:
    body = {
        "amount": order.amount,
        "currency": order.currency,
        "payment_id": f"pay_{order.id}",
        "confirm": True,
        "capture_method": "automatic",
        "payment_method": "card",
        "payment_method_type": "credit",
        "payment_method_data": {
            "card": {
                "card_number": card,
                "card_exp_month": "12",
                "card_exp_year": "2030",
                "card_cvc": "123",
                "card_holder_name": "Demo Shopper",
            }
        },
        "billing": {
            "address": {
                "line1": "1 Demo Street",
                "city": "San Francisco",
                "state": "CA",
                "zip": "94105",
                "country": "US",
                "first_name": "Demo",
                "last_name": "Shopper",
            },
            "phone": {"number": "5555550100", "country_code": "+1"},
        },
        "metadata": {"order_id": order.id},
    }
    # The payment id is ours, so a retried create is safe: the processor answers HE_01.
    with ProcessorClient(base_url, api_key) as client:
        result: dict[str, Any] = client.request("POST", "/payments", json=body)
    return result
