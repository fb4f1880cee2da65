"""Webhook secrets are normalised and validated when the configuration is read (issue hole 4).

``HOOKLEDGER_SECRETS="primary: key"`` used to keep the space (every webhook 401, silently), and
a secret id over 64 characters started fine, then every webhook was a 500 on PostgreSQL (the
id is stored with each event).
"""

from __future__ import annotations

import pytest

from receiver.config.settings import Settings
from receiver.core.errors import ConfigurationError
from receiver.core.signature import MAX_SECRET_ID_LENGTH, Secret, parse_secrets, sign, verify

VALUE = "whsec_0123456789abcdef"


@pytest.mark.parametrize(
    "spec",
    [
        f"primary: {VALUE}",
        f" primary :{VALUE} ",
        f"primary:\t{VALUE}\n",
        {"primary ": f" {VALUE}"},
    ],
    ids=["space-after-colon", "spaces-around", "tab-and-newline", "mapping"],
)
def test_spaces_around_ids_and_values_are_stripped(spec: object) -> None:
    (secret,) = parse_secrets(spec)  # type: ignore[arg-type]
    assert secret == Secret("primary", VALUE.encode())
    body = b'{"event_id":"evt_1"}'
    assert verify(body, sign(body, VALUE), [secret]) == "primary"


def test_several_secrets_and_empty_entries() -> None:
    secrets = parse_secrets(f"new: {VALUE}1 , old : {VALUE}2,")
    assert [s.id for s in secrets] == ["new", "old"]
    assert [s.value for s in secrets] == [f"{VALUE}1".encode(), f"{VALUE}2".encode()]
    (bare,) = parse_secrets(f"  {VALUE}  ")
    assert bare == Secret("default", VALUE.encode())


def test_an_id_of_the_longest_length_is_accepted() -> None:
    (secret,) = parse_secrets(f"{'i' * MAX_SECRET_ID_LENGTH}:{VALUE}")
    assert len(secret.id) == 64


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (f":{VALUE}", "needs a non-empty id"),
        (f"   :{VALUE}", "needs a non-empty id"),
        ("primary:", "'primary' is empty"),
        ("primary:   ", "'primary' is empty"),
        (f"{'x' * 65}:{VALUE}", "is 65 characters long; ids are at most 64"),
        (f"a:{VALUE},a :{VALUE}2", "ids must be unique: 'a' repeated"),
        (f"pri\tmary:{VALUE}", "non-printable character"),
        (f"pri\u200bmary:{VALUE}", "non-printable character"),
        ("primary:whsec_\x00abc", "'primary' contains a non-printable character"),
        ("primary:whsec\nabc", "'primary' contains a non-printable character"),
        ("primary:whsec\u00a0abc", "'primary' contains a non-printable character"),
        ({"": VALUE}, "needs a non-empty id"),
        ({"p": " "}, "'p' is empty"),
    ],
    ids=[
        "empty-id",
        "blank-id",
        "empty-value",
        "blank-value",
        "long-id",
        "duplicate-id",
        "tab-in-id",
        "zero-width-in-id",
        "nul-in-value",
        "newline-in-value",
        "nbsp-in-value",
        "mapping-empty-id",
        "mapping-blank-value",
    ],
)
def test_bad_secrets_are_refused_with_one_line_that_shows_no_secret(
    spec: object, message: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        parse_secrets(spec)  # type: ignore[arg-type]
    text = str(caught.value)
    assert message in text
    assert "\n" not in text
    assert VALUE not in text and "whsec" not in text
    # The same error when the settings are read (init_app, the CLIs).
    with pytest.raises(ConfigurationError, match="webhook secret"):
        Settings.resolve({"HOOKLEDGER_SECRETS": spec}, {}, default_database_url="sqlite://")


def test_secret_objects_are_checked_too() -> None:
    with pytest.raises(ConfigurationError, match="at most 64"):
        Secret("x" * 65, b"k")
    with pytest.raises(ConfigurationError, match="surrounding spaces"):
        Secret(" primary", b"k")
    with pytest.raises(ConfigurationError, match="is empty"):
        Secret("primary", b"")
    with pytest.raises(ConfigurationError, match="Secret objects"):
        parse_secrets(["primary:key"])  # type: ignore[list-item]
    # A bytes value is the caller's exact key, taken as it is.
    assert Secret("raw", b" \x00key").value == b" \x00key"
