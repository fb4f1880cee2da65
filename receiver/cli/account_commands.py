"""``hookledger accounts``: processor accounts kept in hookledger's own table, sealed.

- ``add ID --merchant-id M [--profile-id P ...] [--base-url U] [--environment E]``;
- ``list`` and ``show ID`` (never a secret or key: their ids, or "set");
- ``deactivate ID`` / ``activate ID``; ``remove ID`` (the row only: the account's events,
  transitions and projections stay until pruned);
- ``set-secret ID``: a new webhook secret first, the previous one kept (rotation);
- ``set-keys ID``: a new API key and/or admin key (``--drop-admin-key`` removes the latter).

Secrets and keys never come from the command line (other users see it in ``ps``): they are
read as one JSON object, ``{"secrets": "id:secret,...", "api_key": "...", "admin_key":
"..."}``, from standard input (the default) or from the file ``--credentials PATH``. They
are sealed with the primary data key before they are stored; without a data key
(``HOOKLEDGER_DATA_KEYS``) nothing is stored. An account is seen by the running web
processes and the reconciler at once (read per request, no restart).

Exit codes: 0 ok; 1 no such account; 2 usage or configuration error (a duplicate id, an id
configured in HOOKLEDGER_ACCOUNTS, no data key, bad credentials, the schema behind);
5 the database is unreachable.
"""

from __future__ import annotations

import json
import sys
from typing import IO, Any

import click
from flask.cli import with_appcontext

from receiver.cli.common import EXIT_PROBLEM, describe_error, read_only
from receiver.cli.context import app_state, checked_engine, fail
from receiver.core.accounts import DEFAULT_ACCOUNT, Account, check_account_id
from receiver.core.errors import ConfigurationError, HookledgerError
from receiver.core.signature import Secret, parse_secrets
from receiver.storage.account_table import AccountTable, StoredRow, require_data_key

CREDENTIALS_HELP = (
    "Where the secrets and keys are read from: a JSON object "
    '{"secrets": "id:secret,...", "api_key": "...", "admin_key": "..."}; '
    "'-' (the default) is standard input. Never give them as arguments."
)
_CREDENTIAL_KEYS = frozenset({"secrets", "api_key", "admin_key"})


def _table() -> AccountTable:
    checked_engine()  # the schema first: one line and exit 2 when it is behind
    return app_state().store.accounts


def _run(action: Any) -> Any:
    """``action()``, its errors said in one line with their exit code (never a value)."""
    try:
        return action()
    except HookledgerError as exc:
        message, code = describe_error(exc)
        fail(message, code)


def _credentials(source: IO[str]) -> dict[str, str]:
    """The JSON object of credentials (its errors never quote it)."""
    if getattr(source, "isatty", lambda: False)():
        fail("pipe the credentials JSON on standard input, or give --credentials PATH")
    text = source.read()
    try:
        data = json.loads(text)
    except ValueError:
        fail("the credentials are not a JSON object (nothing of them is shown)")
    if not isinstance(data, dict):
        fail("the credentials are not a JSON object (nothing of them is shown)")
    unknown = sorted(set(data) - _CREDENTIAL_KEYS)
    if unknown:
        fail(
            f"unknown credential(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(sorted(_CREDENTIAL_KEYS))}"
        )
    for key, value in data.items():
        if value is not None and (not isinstance(value, str) or not value.strip()):
            fail(f"credential {key!r} must be a non-empty text")
    return {k: v.strip() for k, v in data.items() if v is not None}


def _secrets(text: str | None) -> tuple[Secret, ...]:
    try:
        secrets = parse_secrets(text)
    except ConfigurationError as exc:
        fail(exc.message)
    if not secrets:
        fail('the credentials need "secrets": the webhook signing secrets, "id:secret,..."')
    return secrets


def _not_configured(account_id: str) -> None:
    """An id of the configuration is the configuration's: refused in the table."""
    configured = {a.id for a in app_state().settings.accounts} | {DEFAULT_ACCOUNT}
    if account_id in configured:
        fail(
            f"account {account_id!r} is configured (HOOKLEDGER_ACCOUNTS or the default "
            "account); a stored account needs another id"
        )


def _row(table: AccountTable, account_id: str) -> StoredRow:
    row = _run(lambda: table.row(account_id))
    if row is None:
        fail(f"no stored account {account_id!r} (hookledger accounts list)", EXIT_PROBLEM)
    assert isinstance(row, StoredRow)
    return row


def _line(data: dict[str, Any]) -> str:
    profiles = ",".join(data["profile_ids"]) or "*"
    return (
        f"{data['id']:<20} {'active' if data['active'] else 'inactive':<8} "
        f"merchant {data['merchant_id']} profiles {profiles} "
        f"secrets [{','.join(data['secret_ids'])}] "
        f"api_key {data['api_key'] or '-'} admin_key {data['admin_key'] or '-'}"
    )


@click.group("accounts", help="Processor accounts kept in hookledger's table (sealed).")
def accounts_group() -> None:
    pass


@accounts_group.command("add")
@click.argument("account_id", metavar="ID")
@click.option("--merchant-id", required=True, help="The processor's merchant id.")
@click.option(
    "--profile-id",
    "profile_ids",
    multiple=True,
    help="A business profile of the merchant this account takes (repeat; none: all).",
)
@click.option("--base-url", default=None, help="The processor's API URL (the reconciler's).")
@click.option(
    "--environment",
    type=click.Choice(["sandbox", "production"]),
    default=None,
    help="The processor environment the API key belongs to.",
)
@click.option("--inactive", is_flag=True, help="Store it deactivated.")
@click.option(
    "--credentials", type=click.File("r"), default="-", show_default=True, help=CREDENTIALS_HELP
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@read_only
@with_appcontext
def accounts_add(
    account_id: str,
    merchant_id: str,
    profile_ids: tuple[str, ...],
    base_url: str | None,
    environment: str | None,
    inactive: bool,
    credentials: IO[str],
    as_json: bool,
) -> None:
    """Store a new account; its secrets and keys are read from --credentials (stdin)."""
    _run(lambda: check_account_id(account_id))
    _not_configured(account_id)
    table = _table()
    _run(lambda: require_data_key(table.storage.keyring))  # before reading any secret
    data = _credentials(credentials)
    account = _run(
        lambda: Account(
            id=account_id,
            merchant_id=merchant_id,
            profile_ids=tuple(profile_ids),
            secrets=_secrets(data.get("secrets")),
            api_key=data.get("api_key"),
            admin_key=data.get("admin_key"),
            base_url=base_url,
            environment=environment,
            active=not inactive,
        )
    )
    _run(lambda: table.add(account))
    row = _row(table, account_id)
    if as_json:
        click.echo(json.dumps(row.describe()))
        return
    prefix = app_state().settings.url_prefix.rstrip("/")
    click.echo(f"account {account_id!r} stored; its webhook URL: {prefix}/{account_id}/")


@accounts_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@read_only
@with_appcontext
def accounts_list(as_json: bool) -> None:
    """The stored accounts (never a secret or key: their ids, or "set")."""
    table = _table()
    rows = [r.describe() for r in _run(table.rows)]
    if as_json:
        click.echo(json.dumps({"accounts": rows}))
        return
    for data in rows:
        click.echo(_line(data))
    click.echo(f"{len(rows)} stored account(s)")


@accounts_group.command("show")
@click.argument("account_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@read_only
@with_appcontext
def accounts_show(account_id: str, as_json: bool) -> None:
    """One stored account (exit 1 if there is none)."""
    data = _row(_table(), account_id).describe()
    if as_json:
        click.echo(json.dumps(data))
        return
    for key, value in data.items():
        shown = ",".join(value) if isinstance(value, list) else value
        click.echo(f"{key}: {'-' if shown in (None, '') else shown}")


def _set_active(account_id: str, active: bool, as_json: bool) -> None:
    table = _table()
    if not _run(lambda: table.set_active(account_id, active)):
        fail(f"no stored account {account_id!r} (hookledger accounts list)", EXIT_PROBLEM)
    state = "active" if active else "inactive"
    if as_json:
        click.echo(json.dumps({"id": account_id, "active": active}))
    else:
        note = "" if active else " (its deliveries are refused: 404 HL_07; not reconciled)"
        click.echo(f"account {account_id!r} is {state}{note}")


@accounts_group.command("deactivate")
@click.argument("account_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@read_only
@with_appcontext
def accounts_deactivate(account_id: str, as_json: bool) -> None:
    """Refuse the account's deliveries (404 HL_07) and stop reconciling it; keep it stored."""
    _set_active(account_id, False, as_json)


@accounts_group.command("activate")
@click.argument("account_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@read_only
@with_appcontext
def accounts_activate(account_id: str, as_json: bool) -> None:
    """Take the account's deliveries again."""
    _set_active(account_id, True, as_json)


@accounts_group.command("remove")
@click.argument("account_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@read_only
@with_appcontext
def accounts_remove(account_id: str, as_json: bool) -> None:
    """Delete the account's row (and its sealed secrets). Its events, transitions and
    projections stay until `hookledger prune` deletes them."""
    table = _table()
    if not _run(lambda: table.remove(account_id)):
        fail(f"no stored account {account_id!r} (hookledger accounts list)", EXIT_PROBLEM)
    if as_json:
        click.echo(json.dumps({"id": account_id, "removed": True}))
    else:
        click.echo(
            f"account {account_id!r} removed; its events, transitions and projections stay "
            "until pruned (hookledger prune)"
        )


@accounts_group.command("set-secret")
@click.argument("account_id", metavar="ID")
@click.option(
    "--drop-previous",
    is_flag=True,
    help="Keep only the new secret (once the processor signs with it everywhere).",
)
@click.option(
    "--credentials",
    type=click.File("r"),
    default="-",
    show_default=True,
    help='Where the new secret is read from: {"secrets": "id:secret"}; \'-\' is stdin.',
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@read_only
@with_appcontext
def accounts_set_secret(
    account_id: str, drop_previous: bool, credentials: IO[str], as_json: bool
) -> None:
    """Rotate the webhook secret: the new one first (it verifies first), the previous primary
    kept after it until --drop-previous, as HOOKLEDGER_SECRETS rotation works."""
    table = _table()
    _run(lambda: require_data_key(table.storage.keyring))
    current = _row(table, account_id).account
    new = _secrets(_credentials(credentials).get("secrets"))
    kept = (
        ()
        if drop_previous
        else tuple(s for s in current.secrets[:1] if s.id not in {n.id for n in new})
    )
    secrets = _run(lambda: parse_secrets((*new, *kept)))
    if not _run(lambda: table.set_secrets(account_id, secrets)):
        fail(f"no stored account {account_id!r} (hookledger accounts list)", EXIT_PROBLEM)
    ids = [s.id for s in secrets]
    if as_json:
        click.echo(json.dumps({"id": account_id, "secret_ids": ids}))
    else:
        click.echo(f"account {account_id!r}: webhook secrets [{','.join(ids)}] (the new one first)")


@accounts_group.command("set-keys")
@click.argument("account_id", metavar="ID")
@click.option("--drop-admin-key", is_flag=True, help="Remove the account's admin key.")
@click.option(
    "--credentials",
    type=click.File("r"),
    default=None,
    help='Where the new keys are read from: {"api_key": "...", "admin_key": "..."} (either '
    "or both); '-' is stdin, the default unless --drop-admin-key is given alone.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@read_only
@with_appcontext
def accounts_set_keys(
    account_id: str, drop_admin_key: bool, credentials: IO[str] | None, as_json: bool
) -> None:
    """Replace the account's API key (a revoked or rolled key) and/or its admin key; the
    reconciler uses the new ones from its next run, without a restart."""
    table = _table()
    _run(lambda: require_data_key(table.storage.keyring))
    _row(table, account_id)
    keys: dict[str, str | None] = {}
    if credentials is not None or not drop_admin_key:
        given = _credentials(credentials or sys.stdin)
        if "secrets" in given:
            fail("set-keys changes keys only: rotate a webhook secret with set-secret")
        keys.update(given)
    if drop_admin_key:
        if "admin_key" in keys:
            fail("--drop-admin-key and a new admin_key: give one of them")
        keys["admin_key"] = None
    if not keys:
        fail('the credentials need "api_key" and/or "admin_key" (or --drop-admin-key)')
    if not _run(lambda: table.set_keys(account_id, keys)):
        fail(f"no stored account {account_id!r} (hookledger accounts list)", EXIT_PROBLEM)
    changed = {k: ("removed" if v is None else "set") for k, v in sorted(keys.items())}
    if as_json:
        click.echo(json.dumps({"id": account_id, **changed}))
    else:
        said = ", ".join(f"{k} {v}" for k, v in changed.items())
        click.echo(f"account {account_id!r}: {said}")


COMMANDS = (accounts_group,)


def register(group: click.Group) -> None:
    """Add ``accounts`` to the ``hookledger`` group."""
    for command in COMMANDS:
        group.add_command(command)
