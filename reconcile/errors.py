"""The public path of the client's and the reconciler's errors: re-exports
:mod:`reconcile.core.errors`, where the code lives (see docs/architecture.md)."""

from reconcile.core.errors import (
    EXCERPT_LIMIT as EXCERPT_LIMIT,
)
from reconcile.core.errors import (
    ID_LIMIT as ID_LIMIT,
)
from reconcile.core.errors import (
    MAX_ID_LENGTH as MAX_ID_LENGTH,
)
from reconcile.core.errors import (
    AdoptionInProgress as AdoptionInProgress,
)
from reconcile.core.errors import (
    ApiError as ApiError,
)
from reconcile.core.errors import (
    AuthenticationError as AuthenticationError,
)
from reconcile.core.errors import (
    EnvironmentMismatch as EnvironmentMismatch,
)
from reconcile.core.errors import (
    InvalidApiKey as InvalidApiKey,
)
from reconcile.core.errors import (
    InvalidRequest as InvalidRequest,
)
from reconcile.core.errors import (
    NotAdopted as NotAdopted,
)
from reconcile.core.errors import (
    NotFound as NotFound,
)
from reconcile.core.errors import (
    PagingError as PagingError,
)
from reconcile.core.errors import (
    ProcessorError as ProcessorError,
)
from reconcile.core.errors import (
    RateLimited as RateLimited,
)
from reconcile.core.errors import (
    ReconcileError as ReconcileError,
)
from reconcile.core.errors import (
    ReconcileLocked as ReconcileLocked,
)
from reconcile.core.errors import (
    RequestBudgetExhausted as RequestBudgetExhausted,
)
from reconcile.core.errors import (
    ServerError as ServerError,
)
from reconcile.core.errors import (
    TransportError as TransportError,
)
from reconcile.core.errors import (
    api_error_from_response as api_error_from_response,
)
from reconcile.core.errors import (
    escape_id as escape_id,
)
from reconcile.core.errors import (
    id_defect as id_defect,
)
from reconcile.core.errors import (
    json_type as json_type,
)
from reconcile.core.errors import (
    safe_excerpt as safe_excerpt,
)

__all__ = [
    "AdoptionInProgress",
    "ApiError",
    "AuthenticationError",
    "EnvironmentMismatch",
    "InvalidApiKey",
    "InvalidRequest",
    "NotAdopted",
    "NotFound",
    "PagingError",
    "ProcessorError",
    "RateLimited",
    "RequestBudgetExhausted",
    "ServerError",
    "TransportError",
    "api_error_from_response",
    "escape_id",
    "id_defect",
    "json_type",
    "safe_excerpt",
    "EXCERPT_LIMIT",
    "ID_LIMIT",
    "MAX_ID_LENGTH",
    "ReconcileError",
    "ReconcileLocked",
]
