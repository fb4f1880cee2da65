"""The processor API over ``requests``: the client, paging, the admin events API.

``from reconcile.client import ProcessorClient`` is the public path; the client lives in
:mod:`reconcile.client.processor`, its transport (``ApiClient``, ``RetryPolicy``) in
:mod:`reconcile.client.transport`, paging in :mod:`reconcile.client.paging` (the contract),
:mod:`reconcile.client.paging_strategies` and :mod:`reconcile.client.list_endpoints`, the admin
events API in :mod:`reconcile.client.events_api`.
"""

from reconcile.client.processor import (
    OBJECT_KINDS as OBJECT_KINDS,
)
from reconcile.client.processor import (
    ObjectKind as ObjectKind,
)
from reconcile.client.processor import (
    ProcessorClient as ProcessorClient,
)
from reconcile.client.processor import (
    environment_of_key as environment_of_key,
)
from reconcile.client.transport import (
    ApiClient as ApiClient,
)
from reconcile.client.transport import (
    Environment as Environment,
)
from reconcile.client.transport import (
    RetryPolicy as RetryPolicy,
)
from reconcile.client.transport import (
    path_segment as path_segment,
)

__all__ = [
    "OBJECT_KINDS",
    "ApiClient",
    "Environment",
    "ObjectKind",
    "ProcessorClient",
    "RetryPolicy",
    "environment_of_key",
    "path_segment",
]
