"""The sandbox's business profile record: where a profile's webhooks go and the key they are
signed with.

A Hyperswitch merchant account has one or more *business profiles* (a brand, a region, a
shop). Every payment, payout and mandate is created under one (the request's ``profile_id``,
else the merchant's default profile); its refunds and disputes belong to its profile. Each
profile has its own webhook URL and its own signing key, ``payment_response_hash_key``
(``hyperswitch-facts.md`` section 1): a webhook of an object is signed with its profile's key
and sent to its profile's URL. A profile is not an API answer of the sandbox (no ``to_api``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True, eq=False)
class BusinessProfile:
    """One business profile: its id, webhook URL (``None``: events are recorded, never sent)
    and signing key (never in a repr)."""

    profile_id: str
    webhook_url: str | None
    webhook_secret: str = field(repr=False)
