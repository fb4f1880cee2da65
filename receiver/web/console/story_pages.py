"""The console's order search and object story pages (registered on the console's blueprint
by :func:`register`, behind its access rule; both are GET pages, so no CSRF token is
involved, and they send the console's security headers like every other page).

- ``/orders?order=REF`` (``&account=...``): the events of an order, found through the order
  index (:mod:`receiver.storage.order_refs`), in every account unless one is chosen, each
  row naming its account and linking to its object's story; what the index cannot see is
  said above the results (:mod:`receiver.storage.order_search`);
- ``/object?kind=payment&id=pay_x`` (``&account=A``): one object's whole story
  (:mod:`receiver.storage.object_story`); an object in several accounts lists them to
  choose from. Error texts are masked, as on the event page.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import Blueprint, abort, current_app, request

import receiver.storage.object_story as stories
import receiver.storage.operator_reads as queries
from receiver.core.accounts import is_account_id
from receiver.core.order_refs import normalise
from receiver.storage.order_search import search_notes
from receiver.web.state import receiver_state

#: Order search results per page.
PAGE_SIZE = 100


def register(
    bp: Blueprint, render: Callable[..., str], *, accounts_from: Callable[..., Any]
) -> None:
    """Add the pages to the console's blueprint ``bp``; ``render`` renders a console page."""

    @bp.get("/orders")
    def orders() -> str:
        store = receiver_state(current_app).store
        raw = request.args.get("order") or ""
        order = normalise(raw)
        chosen = accounts_from(request.args.getlist("account"))
        offset = max(0, min(10_000_000, _int(request.args.get("offset"), 0)))
        page = None
        notes: list[str] = []
        q = queries.EventQuery(accounts=chosen, order=order, limit=PAGE_SIZE, offset=offset)
        if order is not None:
            page = queries.list_events(store.engine, q, keyring=store.keyring)
            notes = search_notes(
                store.engine, store.keyring, store.storage.order_fields, accounts=chosen
            )
        links: dict[str, str | None] = {"prev": None, "next": None}
        if page is not None:
            links = _links(page, order or "", chosen)
        return render(
            "orders.html",
            order=raw.strip(),
            page=page,
            notes=notes,
            q=q,
            links=links,
            fields=store.storage.order_fields.describe(),
            title="Find an order",
            tab="orders",
        )

    @bp.get("/object")
    def object_story() -> str:
        store = receiver_state(current_app).store
        kind = request.args.get("kind") or ""
        object_id = request.args.get("id") or ""
        account = request.args.get("account") or None
        if kind not in stories.KINDS or not object_id or len(object_id) > 255:
            abort(404)
        if account is not None and not is_account_id(account):
            abort(404)
        try:
            story = stories.object_story(
                store.engine, kind, object_id, account=account, keyring=store.keyring
            )
        except stories.AmbiguousObject as exc:
            return render(
                "object_accounts.html",
                kind=kind,
                object_id=object_id,
                accounts=exc.accounts,
                title=f"{kind}:{object_id}",
                tab="orders",
            )
        if story is None:
            abort(404)
        return render(
            "object.html",
            s=story,
            title=story.ref,
            tab="orders",
        )


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def _links(page: queries.Page, order: str, accounts: tuple[str, ...]) -> dict[str, str | None]:
    from flask import url_for

    def link(offset: int) -> str:
        return url_for(".orders", order=order, account=list(accounts), offset=offset)

    return {
        "prev": link(max(0, page.offset - page.limit)) if page.offset > 0 else None,
        "next": link(page.offset + page.limit) if page.has_more else None,
    }


__all__ = ["register"]
