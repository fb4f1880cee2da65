"""The processor API client: a merchant's secret key, objects by id, lists of objects.

>>> with ProcessorClient("https://sandbox.hyperswitch.io", api_key) as client:  # doctest: +SKIP
...     payment = client.get_payment("pay_123")
...     for refund in client.iter_refunds(start, end):
...         ...

:class:`ProcessorClient` is built on :class:`~reconcile.client.transport.ApiClient`, the
transport: every call is authenticated, retried, rate limited, redacted and turned into typed
errors as :mod:`reconcile.client.transport` describes.

Objects are read by id (``get_payment``, ``get_refund``, ``get_payout``, ``get_dispute``,
``get_mandate``, or ``get_object(kind, id)``); an id must be a clean string (1 to 255 printable
characters), else :class:`ValueError` is raised before anything is sent (its message never
quotes the id), and it is URL-quoted as one path segment.

Lists (``iter_payments``, ``iter_refunds``, ``iter_payouts``, ``iter_disputes``) return the
pagers of :mod:`reconcile.client.paging` (the refunds, the payouts' POST and the disputes
lists take a business profile's ``profile_id``; Hyperswitch's payments list, which the
merchant key may read, has no such filter): each object at most once, rows checked against the
window, row problems on ``pager.row_errors`` (ids redacted of the key, then escaped), what
could not be read on ``pager.incomplete`` (or raised as
:class:`~reconcile.core.errors.PagingError`); see that module. Every list has a request
budget: at most ``max_requests`` list calls per iterator (the call's ``max_requests``, else
the client's ``max_list_requests``, else 1,000: 100,000 objects at 100 per page). When it is
spent the iterator ends with :class:`~reconcile.core.errors.RequestBudgetExhausted` (which list,
how many requests, the unread window, where paging stood, how to raise the budget), or with
``on_stuck="report"`` reports the unread window in ``pager.incomplete``; it never pages
without end, even against a server whose every page looks like progress.

For :class:`ProcessorClient` the key decides the environment (``snd_`` sandbox, ``prd_``
production); publishable (``pk_...``) and administrative (``admin_...``) keys are refused. An
explicit ``environment`` that disagrees with the key, a sandbox key on a production host (or
the reverse), and a production key over plain HTTP to anything but the local machine raise
:class:`~reconcile.core.errors.EnvironmentMismatch` when the client is built (the host and https
checks are :class:`~reconcile.client.transport.ApiClient`'s, so the events client has them too).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Final, Literal

import requests

from reconcile.client.list_endpoints import (
    PaymentsDialect,
    PayoutsDialect,
    RefundsDialect,
    disputes_pager,
    payments_pager,
    payouts_pager,
    refunds_pager,
)
from reconcile.client.paging import DEFAULT_MAX_REQUESTS, OnStuck, Pager, check_budget
from reconcile.client.transport import ApiClient, Environment, RetryPolicy, path_segment
from reconcile.core.errors import (
    ApiError,
    EnvironmentMismatch,
    InvalidApiKey,
    safe_excerpt,
)

__all__ = [
    "OBJECT_KINDS",
    "ObjectKind",
    "ProcessorClient",
    "environment_of_key",
]

ObjectKind = Literal["payment", "refund", "dispute", "payout", "mandate"]

#: The retrieve path of each kind :meth:`ProcessorClient.get_object` knows.
OBJECT_KINDS: Final[Mapping[str, str]] = {
    "payment": "/payments",
    "refund": "/refunds",
    "dispute": "/disputes",
    "payout": "/payouts",
    "mandate": "/mandates",
}

_KEY_PREFIXES: Final[Mapping[str, Environment]] = {"snd_": "sandbox", "prd_": "production"}


def environment_of_key(api_key: str) -> Environment | None:
    """The environment a secret key belongs to, or ``None`` for an unknown prefix.

    Raises :class:`~reconcile.core.errors.InvalidApiKey` for an empty or malformed key and for
    publishable and administrative keys, which this server-side client must not use.
    """
    if not isinstance(api_key, str) or not api_key:
        raise InvalidApiKey("an API key is required (a secret key: snd_... or prd_...)")
    if not all("\x21" <= ch <= "\x7e" for ch in api_key):
        raise InvalidApiKey("the API key contains whitespace or non-ASCII characters")
    if api_key.startswith("pk_"):
        raise InvalidApiKey(
            "a publishable key (pk_...) is for browsers; the API client needs a secret key "
            "(snd_... or prd_...)"
        )
    if api_key.startswith("admin_"):
        raise InvalidApiKey(
            "an administrative key (admin_...) only creates API keys; the API client needs a "
            "secret key (snd_... or prd_...)"
        )
    for prefix, environment in _KEY_PREFIXES.items():
        if api_key.startswith(prefix):
            return environment
    return None


class ProcessorClient(ApiClient):
    """A client of the processor's REST API (retrieve and list), authenticated by a secret key.

    ``max_list_requests``: the default request budget of each list iterator (``iter_*``; a
    call's own ``max_requests`` wins; ``None``: 1,000 list calls). ``sleep``, ``clock`` (Unix
    time, for ``X-RateLimit-Reset``) and ``rng`` (the jitter) are injectable for tests. A
    ``session`` passed in is used but not closed by :meth:`close`.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        environment: Environment | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        retry: RetryPolicy = RetryPolicy(),  # noqa: B008 - frozen, hence shareable
        session: requests.Session | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        max_list_requests: int | None = None,
    ) -> None:
        key_environment = environment_of_key(api_key)
        if environment is not None and environment not in ("sandbox", "production"):
            raise ValueError("environment must be 'sandbox' or 'production'")
        if key_environment is None and environment is None:
            raise InvalidApiKey(
                "the API key has no snd_/prd_ prefix, so sandbox and production cannot be told "
                "apart; pass environment='sandbox' or environment='production'"
            )
        if environment is not None and key_environment not in (None, environment):
            raise EnvironmentMismatch(
                f"environment={environment!r} but the API key is a {key_environment} key"
            )
        resolved: Environment = environment or key_environment or "sandbox"
        super().__init__(
            base_url,
            api_key,
            environment=resolved,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retry=retry,
            session=session,
            sleep=sleep,
            clock=clock,
            rng=rng,
        )
        self.max_list_requests = check_budget(max_list_requests, "max_list_requests")

    def _budget(self, max_requests: int | None) -> int:
        """A list call's budget: its own, else the client's, else the default."""
        if max_requests is not None:
            return max_requests
        return self.max_list_requests or DEFAULT_MAX_REQUESTS

    def _key_hint(self) -> str:
        return f"{self._api_key[:4]}***"  # the prefix only (snd_/prd_): it names the environment

    # -- resources ----------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """``GET /health``: the JSON object answered, or ``{"message": <text>}`` for plain text."""
        body = self.request("GET", "/health", allow_text=True)
        if isinstance(body, dict):
            return body
        return {"message": safe_excerpt(str(body))}

    def get_payment(self, payment_id: str) -> dict[str, Any]:
        """``GET /payments/{payment_id}``."""
        return self._get_object("/payments", payment_id, "payment_id")

    def get_refund(self, refund_id: str) -> dict[str, Any]:
        """``GET /refunds/{refund_id}``."""
        return self._get_object("/refunds", refund_id, "refund_id")

    def get_payout(self, payout_id: str) -> dict[str, Any]:
        """``GET /payouts/{payout_id}``."""
        return self._get_object("/payouts", payout_id, "payout_id")

    def get_dispute(self, dispute_id: str) -> dict[str, Any]:
        """``GET /disputes/{dispute_id}``."""
        return self._get_object("/disputes", dispute_id, "dispute_id")

    def iter_payments(
        self,
        start: datetime,
        end: datetime,
        *,
        dialect: PaymentsDialect = "hyperswitch",
        page_size: int = 100,
        on_stuck: OnStuck = "raise",
        max_requests: int | None = None,
    ) -> Pager:
        """Payments created in ``[start, end]`` (aware datetimes), each once; see :mod:`.paging`.

        ``max_requests``: the list calls this window may cost (``None``: the client's
        ``max_list_requests``, else 1,000); when they are spent the iterator raises
        :class:`~reconcile.core.errors.RequestBudgetExhausted` (``on_stuck="report"``: the
        unread window is reported in ``pager.incomplete``). The same holds for every ``iter_*``.
        """
        return payments_pager(
            self.request,
            start,
            end,
            dialect=dialect,
            page_size=page_size,
            on_stuck=on_stuck,
            max_requests=self._budget(max_requests),
            redact=self._redact,
        )

    def iter_refunds(
        self,
        start: datetime,
        end: datetime,
        *,
        dialect: RefundsDialect = "hyperswitch",
        page_size: int = 100,
        on_stuck: OnStuck = "raise",
        max_requests: int | None = None,
        profile_id: str | None = None,
    ) -> Pager:
        """Refunds created in ``[start, end]`` (aware datetimes), each once; see :mod:`.paging`.

        ``dialect="hyperswitch"`` filters by ``start_time``/``end_time``, ``"seed"`` by the
        seed's ``created_gte``/``created_lte``. ``profile_id``: one business profile's
        refunds only (the processor filters; the Hyperswitch dialect).
        """
        return refunds_pager(
            self.request,
            start,
            end,
            dialect=dialect,
            page_size=page_size,
            on_stuck=on_stuck,
            max_requests=self._budget(max_requests),
            redact=self._redact,
            profile_id=profile_id,
        )

    def iter_payouts(
        self,
        start: datetime,
        end: datetime,
        *,
        dialect: PayoutsDialect = "get",
        page_size: int | None = None,
        on_stuck: OnStuck = "raise",
        max_requests: int | None = None,
        profile_id: str | None = None,
    ) -> Pager:
        """Payouts created in ``[start, end]`` (aware datetimes), each once; see :mod:`.paging`.

        ``profile_id``: one business profile's payouts only (``dialect="post"``: the GET
        list takes no such filter, :class:`ValueError`)."""
        return payouts_pager(
            self.request,
            start,
            end,
            dialect=dialect,
            page_size=page_size,
            on_stuck=on_stuck,
            max_requests=self._budget(max_requests),
            redact=self._redact,
            profile_id=profile_id,
        )

    def iter_disputes(
        self,
        start: datetime,
        end: datetime,
        *,
        page_size: int = 100,
        on_stuck: OnStuck = "raise",
        max_requests: int | None = None,
        profile_id: str | None = None,
    ) -> Pager:
        """Disputes created in ``[start, end]`` (aware datetimes), each once; see :mod:`.paging`.

        ``profile_id``: one business profile's disputes only."""
        return disputes_pager(
            self.request,
            start,
            end,
            page_size=page_size,
            on_stuck=on_stuck,
            max_requests=self._budget(max_requests),
            redact=self._redact,
            profile_id=profile_id,
        )

    def get_mandate(self, mandate_id: str) -> dict[str, Any]:
        """``GET /mandates/{mandate_id}`` (``MandateResponse``)."""
        return self._get_object("/mandates", mandate_id, "mandate_id")

    def get_object(self, kind: ObjectKind, object_id: str) -> dict[str, Any]:
        """Retrieve one object by kind (``payment``, ``refund``, ``dispute``, ``payout``,
        ``mandate``) and id, as the ``get_*`` methods do."""
        collection = OBJECT_KINDS.get(kind) if isinstance(kind, str) else None
        if collection is None:
            raise ValueError(f"kind must be one of {', '.join(OBJECT_KINDS)}")
        return self._get_object(collection, object_id, "object_id")

    def _get_object(
        self, collection: str, object_id: str, name: str = "object_id"
    ) -> dict[str, Any]:
        path = f"{collection}/{path_segment(object_id, name)}"
        body = self.request("GET", path)
        if not isinstance(body, dict):
            raise ApiError("expected a JSON object", status=200, method="GET", path=path)
        return body
