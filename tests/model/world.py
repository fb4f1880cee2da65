"""The world of the model-based test: processor accounts, the shop on hookledger, the
network between them and the clock, in one process under one frozen clock (freezegun).

- The **default account** is the installation's first (``HOOKLEDGER_SECRETS``,
  ``HOOKLEDGER_MERCHANT_ID``, ``HOOKLEDGER_API_KEY``): merchant ``merchant_main``.
- **Further accounts** are a platform's sellers (a merchant each) or further business
  profiles of a seller's merchant; each is stored in hookledger's account table
  (``hookledger accounts add``) when it goes live, naming its merchant and profile, at its
  own URL (``/webhooks/<account>/``) or at the shared one.
- An account may have **history**: before it goes live its webhooks go to the merchant's
  earlier system (:class:`tests.model.processor.EarlierSystem`), which handles them. Going
  live is the deploy (the profile's webhook URL now points at hookledger: the account is
  added to hookledger then) and ``reconcile adopt`` (perhaps within a request budget of 1,
  resumed later). An account without history is declared new (``adopt --new-account``).
- ``reconcile`` and ``reconcile adopt`` run as the commands (click, in-process, with the
  environment an operator sets), against the merchants served on loopback; the worker runs
  in-process (:meth:`Worker.drain`, its batches as ``hookledger worker --burst`` runs them).

What each part holds:

- :class:`Account`: the model's view of one account (its merchant, profile, URL, stage);
- :class:`World`: everything above, with the moves the rules make.
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

import sqlalchemy as sa
from click.testing import CliRunner
from flask import Flask
from freezegun import freeze_time

import receiver.core.objects as objects
import receiver.storage.database as db
import reconcile.sandbox.state as sandbox_state
from receiver import WebhookReceiver
from receiver.core.accounts import DEFAULT_ACCOUNT
from receiver.core.accounts import Account as HookledgerAccount
from receiver.core.errors import HookledgerError
from receiver.core.events import parse_event
from receiver.core.signature import parse_secrets
from receiver.storage.tables import EventStatus, InboxEvent, Projection
from reconcile.cli.commands import cli as reconcile_cli
from reconcile.client.events_api import EventsClient
from reconcile.client.processor import ProcessorClient
from reconcile.sandbox.errors import SandboxError
from reconcile.sandbox.state import Sandbox
from reconcile.storage.store import RECONCILE_MIGRATIONS
from tests.conftest import build_app
from tests.model.processor import (
    ADMIN_KEY,
    HOOKLEDGER,
    OLD_SYSTEM,
    Ids,
    Merchant,
    Network,
    Processor,
    Request,
    Thing,
    announced,
    api_object,
    state_key,
    things,
)
from tests.model.shop import METADATA, TAKEN, Call, Shop

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
#: The engine factory itself (``World.reconcile`` patches the module's name).
_make_engine = db.make_engine
LEASE_SECONDS = 60.0
DATA_KEY = base64.b64encode(b"m" * 32).decode()
MAIN = "merchant_main"
MAIN_KEY = "snd_model_main_0123456789"
CARDS = {
    "paid": "4242424242424242",
    "held": "4242424242424242",
    "declined": "4000000000000002",
    "processing": "4000000000000077",
    "held_async": "4000000000000333",
}


@dataclass
class Account:
    """The model's view of one processor account."""

    id: str
    merchant: Merchant
    profile: str
    secret: str
    #: Its URL on hookledger: its own (``/webhooks/<id>/``) or the shared one.
    shared_url: bool
    #: The reconciler reads the processor's events API for it (an admin key).
    events_api: bool
    #: history (the earlier system) -> deployed -> adopting (a cut-over) -> live
    stage: str
    deployed_at: datetime | None = None
    cutover_at: datetime | None = None
    live_at: datetime | None = None
    #: Adoption's first run was told the deploy (``--deployed-at``).
    told_deploy: bool = False

    @property
    def url(self) -> str:
        return f"{HOOKLEDGER}/" if self.shared_url else f"{HOOKLEDGER}/{self.id}/"

    @property
    def on_hookledger(self) -> bool:
        return self.stage != "history"

    @property
    def adopted(self) -> bool:
        """A cut-over is recorded (adoption started, or the account was declared new)."""
        return self.stage in ("adopting", "live")


@dataclass
class Run:
    """One command's outcome."""

    args: tuple[str, ...]
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout) if self.stdout.strip() else None


@dataclass
class World:
    """See the module docstring."""

    url: str
    engine: sa.Engine
    frozen: Any
    app: Flask
    shop: Shop
    network: Network
    server: Processor
    ids: Ids
    merchants: dict[str, Merchant] = field(default_factory=dict)
    accounts: dict[str, Account] = field(default_factory=dict)
    #: (account, kind, id) -> [(state, when)], as the processor moved it.
    moves: dict[tuple[str, str, str], list[tuple[str, datetime]]] = field(default_factory=dict)
    runs: list[Run] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    #: account -> when a webhook first reached hookledger for it.
    first_delivery: dict[str, datetime] = field(default_factory=dict)
    _counter: int = 0

    # -- time -----------------------------------------------------------------------------

    def now(self) -> datetime:
        return datetime.now(UTC)

    def advance(self, delta: timedelta) -> None:
        """The clock moves on; what waits at the processor moves (``tick``)."""
        self.frozen.tick(delta)
        for merchant in self.merchants.values():
            merchant.sandbox.tick()
        self.observe_processor()

    # -- accounts -------------------------------------------------------------------------

    def waiting(self, *stages: str) -> list[Account]:
        """The accounts at one of ``stages``."""
        return [a for a in self.accounts.values() if a.stage in stages]

    def sandbox(
        self, merchant_id: str, profile: str, webhook_url: str | None, secret: str, key: str
    ) -> Sandbox:
        made = Sandbox(
            key,
            admin_api_key=ADMIN_KEY,
            webhook_url=webhook_url,
            webhook_secret=secret,
            merchant_id=merchant_id,
            profile_id=profile,
            send=self.network.send,
            auto_dispute=False,
        )
        self.merchants[merchant_id] = Merchant(made, key)
        self.server.add(made)
        return made

    def add_account(
        self, *, seller: bool, history: bool, events_api: bool, shared_url: bool
    ) -> Account | None:
        """A platform's new seller (a merchant of its own), or another business profile of
        a seller's merchant; with ``history`` it traded before hookledger (its webhooks go
        to the earlier system until it is deployed)."""
        self._counter += 1
        n = self._counter
        account_id = f"s{n}" if seller else f"b{n}"
        secret = f"whsec_{account_id}_0123456789abcdef"
        profile = f"pro_{account_id}"
        first_url = f"{OLD_SYSTEM}/{account_id}/" if history else None
        if seller:
            merchant_id = f"merchant_{account_id}"
            key = f"snd_model_{account_id}_0123456789"
            made = self.sandbox(merchant_id, profile, first_url, secret, key)
            merchant = self.merchants[merchant_id]
        else:
            candidates = [
                m for m in self.merchants.values() if m.merchant_id != MAIN and not m.single
            ]
            if not candidates:
                return None
            merchant = candidates[n % len(candidates)]
            made = merchant.sandbox
            made.add_profile(profile, webhook_url=first_url, webhook_secret=secret)
        merchant.accounts[profile] = account_id
        account = Account(
            id=account_id,
            merchant=merchant,
            profile=profile,
            secret=secret,
            shared_url=shared_url,
            events_api=events_api,
            stage="history",
        )
        self.accounts[account_id] = account
        what = "seller" if seller else f"profile of {merchant.merchant_id}"
        self.note(
            f"account {account_id} ({what}, events API {events_api}): "
            + ("trades before hookledger" if history else "new")
        )
        if not history:
            self.deploy(account)
            self.adopt(account, new_account=True)
        return account

    def deploy(self, account: Account) -> None:
        """The deploy that points the account's webhooks at hookledger (and switches its
        earlier handling off): what the processor sends from now on, retries of earlier
        events included, goes to hookledger."""
        assert account.stage == "history"
        sandbox = account.merchant.sandbox
        self.frozen.tick(timedelta(seconds=1))  # a deploy takes a moment: never at a change
        if account.id != DEFAULT_ACCOUNT:
            self.shop.store.accounts.add(
                HookledgerAccount(
                    id=account.id,
                    merchant_id=account.merchant.merchant_id,
                    profile_ids=(account.profile,),
                    secrets=parse_secrets(f"k1:{account.secret}"),
                    api_key=account.merchant.api_key,
                    admin_key=ADMIN_KEY if account.events_api else None,
                )
            )
        sandbox.profile(account.profile).webhook_url = account.url
        account.stage = "deployed"
        account.deployed_at = self.now()
        self.note(f"deploy {account.id} at {account.url.removeprefix(HOOKLEDGER)}")

    def adopt(
        self,
        account: Account,
        *,
        new_account: bool = False,
        budget: int | None = None,
        tell_deploy: bool = True,
    ) -> Run:
        """``reconcile adopt`` (perhaps within a request budget), its first run told the
        deploy (``--deployed-at``) or not (``tell_deploy``; a resumed run passes what the
        first one did). Not told, and with no webhook delivery hookledger ever got for the
        account, it refuses (exit 2): the account stays deployed, not adopted."""
        self.frozen.tick(timedelta(seconds=1))  # after what came before, never at it
        args = ["--account", account.id, "adopt", "--json"]
        first = account.cutover_at is None
        told = tell_deploy if first else account.told_deploy
        if new_account:
            args.append("--new-account")
        else:  # nothing is older than the world: no need to read 180 days of disputes
            args += ["--since", f"{START - timedelta(days=1):%Y-%m-%d}"]
            if told:
                assert account.deployed_at is not None
                args += ["--deployed-at", f"{account.deployed_at:%Y-%m-%dT%H:%M:%S.%f}"]
        if budget is not None:
            args += ["--max-requests", str(budget)]
        run = self.reconcile(*args)
        self.note(f"reconcile {' '.join(args)}: exit {run.code}")
        if run.code == 2 and first and not told and "--deployed-at" in run.stderr:
            self.note(f"  refused: {run.stderr.strip().splitlines()[-1][:160]}")
            return run
        if run.code not in (0, 4):
            raise AssertionError(f"reconcile adopt failed: {run.code} {run.stderr.strip()}")
        if first:
            account.cutover_at = self.now()
            account.told_deploy = told and not new_account
        finished = run.code == 0
        account.stage = "live" if finished else "adopting"
        if finished and account.live_at is None:
            account.live_at = self.now()
        return run

    def history_end(self, account: Account) -> datetime | None:
        """Where the README says the earlier system's history ends: the cut-over, or the
        deploy adoption was told if earlier, or five minutes before the first delivery
        hookledger was sent, if that came before both."""
        ends = account.cutover_at
        if ends is None:
            return None
        if account.told_deploy and account.deployed_at is not None:
            ends = min(ends, account.deployed_at)
        first = self.first_delivery.get(account.id)
        if first is not None and first < ends:
            return first - timedelta(minutes=5)
        return ends

    def reached(self, request: Request) -> None:
        """A webhook reaches hookledger: note the first of each account's."""
        event = parse_event(request.body)
        merchant = self.merchants.get(event.merchant_id or "")
        if merchant is None:
            return
        profile = event.profile_id
        owners = set(merchant.accounts.values())
        account = (
            merchant.accounts.get(profile)
            if profile
            else (owners.pop() if len(owners) == 1 else None)
        )
        if account is not None and account not in self.first_delivery:
            self.first_delivery[account] = self.now()

    # -- the commands ---------------------------------------------------------------------

    def environment(self) -> dict[str, str | None]:
        main = self.accounts[DEFAULT_ACCOUNT]
        env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("HOOKLEDGER_")}
        env.update(
            {
                "HOOKLEDGER_DATABASE_URL": self.url,
                "HOOKLEDGER_PROCESSOR_URL": self.server.base_url,
                "HOOKLEDGER_API_KEY": MAIN_KEY,
                "HOOKLEDGER_MERCHANT_ID": MAIN,
                "HOOKLEDGER_SECRETS": f"k1:{main.secret}",
                "HOOKLEDGER_DATA_KEYS": f"k1:{DATA_KEY}",
                "HOOKLEDGER_ADMIN_API_KEY": ADMIN_KEY if main.events_api else None,
            }
        )
        return env

    def reconcile(self, *args: str) -> Run:
        """``reconcile ARGS`` as an operator runs it (exit code, output)."""
        made: list[sa.Engine] = []
        with ExitStack() as stack:
            stack.callback(lambda: [engine.dispose() for engine in made])
            stack.enter_context(
                mock.patch.object(db, "make_engine", lambda url, **_: self._engine_for(url, made))
            )
            result = CliRunner().invoke(
                reconcile_cli, list(args), env=self.environment(), catch_exceptions=True
            )
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        run = Run(tuple(args), int(result.exit_code), result.stdout, result.stderr)
        self.runs.append(run)
        return run

    def _engine_for(self, url: str, made: list[sa.Engine]) -> sa.Engine:
        """The command's engine: its own, as an operator's run has (without the bounds it
        asks for, as before), disposed when the run ends. On the world's engine, each run's
        store left its receive path's connection (held for the thread) open until the test
        ended: a server connection more per run, "too many clients" in the deep profile on
        PostgreSQL."""
        assert url == self.url
        engine = _make_engine(url)
        made.append(engine)
        return engine

    # -- the processor's objects ----------------------------------------------------------

    def things(self, *, accounts: Iterator[Account] | None = None) -> list[Thing]:
        found: list[Thing] = []
        for merchant in self.merchants.values():
            found += things(merchant)
        if accounts is not None:
            wanted = {a.id for a in accounts}
            found = [t for t in found if t.account in wanted]
        return found

    def truth(self, thing: Thing) -> str | None:
        return state_key(self.merchants[thing.merchant].sandbox, thing.kind, thing.object_id)

    def observe_processor(self) -> None:
        """Note every object's moves (the processor's history of each)."""
        now = self.now()
        for thing in self.things():
            key = (thing.account, thing.kind, thing.object_id)
            state = self.truth(thing)
            if state is None:
                continue
            seen = self.moves.setdefault(key, [])
            if not seen or seen[-1][0] != state:
                seen.append((state, now))

    def act(self, account: Account, action: str, arg: int) -> None:
        """Create an object of ``account`` at the processor (a refused move is the
        processor's answer, not the model's failure)."""
        sandbox = account.merchant.sandbox
        try:
            if action in CARDS:
                payment_id = self.payment_id(account, arg)
                made = sandbox.create_payment(
                    {
                        "amount": 5000,
                        "currency": "USD",
                        "payment_id": payment_id,
                        "confirm": True,
                        "capture_method": "manual" if action.startswith("held") else "automatic",
                        "payment_method": "card",
                        "payment_method_type": "credit",
                        "payment_method_data": {
                            "card": {
                                "card_number": CARDS[action],
                                "card_exp_month": "12",
                                "card_exp_year": "2035",
                                "card_cvc": "123",
                            }
                        },
                        "profile_id": account.profile,
                    }
                )
                state = objects.state_of("payment", made)
                if account.stage == "history" and state is not None:
                    # The earlier checkout confirmed it and acted on its API response.
                    self.network.earlier.handle(account.id, "payment", payment_id, state.key)
            elif action == "payout":
                amount = (4000, 4055, 4077, 4002)[arg % 4]
                sandbox.create_payout(
                    {
                        "payout_id": self.ids("po_"),
                        "amount": amount,
                        "currency": "USD",
                        "payout_type": "bank",
                        "auto_fulfill": True,
                        "confirm": True,
                        "profile_id": account.profile,
                    }
                )
            elif action == "mandate":
                account.merchant.single = True
                sandbox.create_mandate(profile_id=account.profile)
            else:  # pragma: no cover - a strategy bug
                raise AssertionError(action)
        except SandboxError as exc:
            self.note(f"  processor refused {action}: {exc}")
        self.observe_processor()

    def payment_id(self, account: Account, arg: int) -> str:
        """A new payment id for ``account``; now and then one another merchant uses too."""
        mine = {t.object_id for t in things(account.merchant) if t.kind == "payment"}
        others = sorted(
            t.object_id
            for m in self.merchants.values()
            if m is not account.merchant
            for t in things(m)
            if t.kind == "payment" and t.object_id not in mine
        )
        if others and arg % 3 == 0:
            return others[arg % len(others)]
        n = len(mine) + 1
        while f"pay_{n:03d}" in mine:
            n += 1
        return f"pay_{n:03d}"

    def move(self, thing: Thing, action: str, arg: int) -> None:
        """Move an object at the processor (see :data:`tests.model.test_world_model.MOVES`)."""
        sandbox = self.merchants[thing.merchant].sandbox
        try:
            if thing.kind == "payment":
                if action == "capture":
                    sandbox.capture_payment(thing.object_id, {})
                elif action == "void":
                    sandbox.cancel_payment(thing.object_id, {})
                elif action == "void_after_capture":
                    sandbox.cancel_post_capture(thing.object_id, {})
                elif action == "refund":
                    amount = (1000, 1077, 1002, 1088)[arg % 4]
                    sandbox.create_refund({"payment_id": thing.object_id, "amount": amount})
                elif action == "dispute":
                    sandbox.open_dispute(thing.object_id)
                else:
                    return
            elif thing.kind == "refund" and action == "fail":
                sandbox.fail_refund(thing.object_id)
            elif thing.kind == "dispute":
                actions = ("challenge", "accept", "win", "lose", "pre_arbitration", "reversal")
                sandbox.dispute_action(thing.object_id, actions[arg % len(actions)])
            elif thing.kind == "payout":
                if action == "reverse":
                    sandbox.reverse_payout(thing.object_id)
                elif action == "fail":
                    sandbox.fail_payout(thing.object_id)
            elif thing.kind == "mandate" and action == "revoke":
                sandbox.revoke_mandate(thing.object_id)
        except SandboxError as exc:
            self.note(f"  processor refused {action} {thing.kind}:{thing.object_id}: {exc}")
        self.observe_processor()

    # -- webhooks ------------------------------------------------------------------------

    def deliver(self) -> None:
        """The processor sends every attempt due now (the network decides each fate)."""
        for merchant in list(self.merchants.values()):
            merchant.sandbox.deliver_due()

    def next_delivery(self) -> datetime | None:
        dues = [m.sandbox.next_delivery_due() for m in self.merchants.values()]
        known = [d for d in dues if d is not None]
        return min(known) if known else None

    # -- hookledger's state ---------------------------------------------------------------

    def projections(self) -> dict[tuple[str, str, str], str]:
        """(account, kind, id) -> projected state key."""
        table = Projection.__table__  # type: ignore[attr-defined]
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(
                    table.c.account,
                    table.c.object_kind,
                    table.c.object_id,
                    table.c.status,
                    table.c.stage,
                )
            ).all()
        return {(r[0], r[1], r[2]): f"{r[4]}/{r[3]}" if r[4] else r[3] for r in rows}

    def open_objects(self) -> set[tuple[str, str, str]]:
        """Objects with events still open in the inbox (pending or being processed)."""
        table = InboxEvent.__table__  # type: ignore[attr-defined]
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(table.c.account, table.c.object_kind, table.c.object_id).where(
                    table.c.status.in_(EventStatus.OPEN)
                )
            ).all()
        return {(r[0], r[1] or "", r[2] or "") for r in rows}

    def inbox_account(self, pk: int) -> str | None:
        table = InboxEvent.__table__  # type: ignore[attr-defined]
        with self.engine.connect() as conn:
            return conn.execute(sa.select(table.c.account).where(table.c.id == pk)).scalar()

    # -- the truth each handler call is checked against -----------------------------------

    def check_call(self, call: Call) -> str | None:
        """Whether a handler call saw its own account's object and merchant (``None``), or
        what it saw of another's."""
        account = self.accounts.get(call.account)
        if account is None:
            return f"{call}: no such account"
        merchant = account.merchant
        if call.merchant_id is not None and call.merchant_id != merchant.merchant_id:
            return (
                f"account {call.account} handled {call.kind}:{call.object_id} "
                f"({call.state}) naming merchant {call.merchant_id}, not its own "
                f"{merchant.merchant_id} (event {call.event_id})"
            )
        owner = None
        for thing in things(merchant):
            if thing.kind == call.kind and thing.object_id == call.object_id:
                owner = thing
        if owner is None or owner.account != call.account:
            whose = owner.account if owner else "nobody"
            return (
                f"account {call.account} handled {call.kind}:{call.object_id} ({call.state}), "
                f"which is {whose}'s at {merchant.merchant_id} (event {call.event_id})"
            )
        if call.profile_id is not None and call.profile_id != owner.profile:
            return (
                f"account {call.account} handled {call}: profile {owner.profile} at the processor"
            )
        return None

    def note(self, line: str) -> None:
        self.log.append(f"[{self.now():%m-%d %H:%M}] {line}")


def _deterministic_ids(ids: Ids) -> ExitStack:
    stack = ExitStack()
    for name in dir(sandbox_state):
        module = getattr(sandbox_state, name)
        if hasattr(module, "new_id") and hasattr(module, "__file__"):
            stack.enter_context(mock.patch.object(module, "new_id", ids))
    return stack


def _frozen_clients(processor: Processor) -> ExitStack:
    """The API clients the commands build speak to ``processor`` in-process, read the frozen
    clock, and retry a failed request without really sleeping."""
    stack = ExitStack()
    for cls in (ProcessorClient, EventsClient):
        defaults = dict(cls.__init__.__kwdefaults__ or {})
        defaults["session"] = processor.session
        defaults["sleep"] = lambda _seconds: None
        defaults["clock"] = lambda: time.time()  # looked up at each call: the frozen clock
        stack.enter_context(mock.patch.object(cls.__init__, "__kwdefaults__", defaults))
    return stack


class Template:
    """One migrated database per test run: each example starts from its tables emptied."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = db.make_engine(url)
        db.upgrade(self.engine)
        db.upgrade(self.engine, tree=RECONCILE_MIGRATIONS)
        METADATA.create_all(self.engine)
        inspector = sa.inspect(self.engine)
        self.tables = [t for t in inspector.get_table_names() if "alembic" not in t]

    def empty(self) -> None:
        with self.engine.begin() as conn:
            if self.engine.dialect.name == "postgresql":
                names = ", ".join(f'"{t}"' for t in self.tables)
                conn.exec_driver_sql(f"TRUNCATE {names} RESTART IDENTITY CASCADE")
            else:
                for table in self.tables:
                    conn.exec_driver_sql(f'DELETE FROM "{table}"')
                if "sqlite_sequence" in sa.inspect(conn).get_table_names():
                    conn.exec_driver_sql("DELETE FROM sqlite_sequence")
            conn.execute(TAKEN.insert().values(key="taken"))

    def dispose(self) -> None:
        self.engine.dispose()


@contextmanager
def world(
    template: Template, *, default_history: bool, default_events_api: bool
) -> Iterator[World]:
    """A fresh world on ``template``'s database (emptied)."""
    template.empty()
    ids = Ids()
    with ExitStack() as stack:
        frozen = stack.enter_context(freeze_time(START, ignore=["hypothesis"]))
        stack.enter_context(_deterministic_ids(ids))
        main_secret = "whsec_main_0123456789abcdef"
        hooks = WebhookReceiver()
        app, _ = build_app(
            template.url,
            hooks,
            secrets=f"k1:{main_secret}",
            merchant_id=MAIN,
            accounts_in_table="1",
            data_keys=f"k1:{DATA_KEY}",
            auto_migrate=False,
            lease_seconds=LEASE_SECONDS,
            max_attempts=1000,
            backoff_base=30,
            backoff_max=1800,
            defer_limit=30 * 86400,
        )
        stack.callback(lambda: WebhookReceiver.state(app).store.engine.dispose())
        server = Processor()
        stack.enter_context(_frozen_clients(server))
        made = World(
            url=template.url,
            engine=template.engine,
            frozen=frozen,
            app=app,
            shop=None,  # type: ignore[arg-type]
            network=None,  # type: ignore[arg-type]
            server=server,
            ids=ids,
        )
        made.network = Network(app.wsgi_app, made.reached)
        made.shop = Shop(
            app,
            hooks,
            frozen=frozen,
            lease_seconds=LEASE_SECONDS,
            takeover=template.engine.dialect.name == "postgresql",
            check=made.check_call,
        )
        first_url = f"{OLD_SYSTEM}/{DEFAULT_ACCOUNT}/" if default_history else None
        made.sandbox(MAIN, "pro_main", first_url, main_secret, MAIN_KEY)
        merchant = made.merchants[MAIN]
        merchant.accounts["pro_main"] = DEFAULT_ACCOUNT
        main = Account(
            id=DEFAULT_ACCOUNT,
            merchant=merchant,
            profile="pro_main",
            secret=main_secret,
            shared_url=True,
            events_api=default_events_api,
            stage="history",
        )
        made.accounts[DEFAULT_ACCOUNT] = main
        if not default_history:
            made.deploy(main)
            made.adopt(main, new_account=True)
        yield made


__all__ = ["Account", "HookledgerError", "Template", "World", "announced", "api_object", "world"]
