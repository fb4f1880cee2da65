"""The public path of hookledger's exception tree: re-exports :mod:`receiver.core.errors`, where
the code lives (see docs/architecture.md)."""

from receiver.core.errors import (
    BodyRedacted as BodyRedacted,
)
from receiver.core.errors import (
    ConfigurationError as ConfigurationError,
)
from receiver.core.errors import (
    DataKeyMissing as DataKeyMissing,
)
from receiver.core.errors import (
    DataNotAuthentic as DataNotAuthentic,
)
from receiver.core.errors import (
    DataUnavailable as DataUnavailable,
)
from receiver.core.errors import (
    EventNotFound as EventNotFound,
)
from receiver.core.errors import (
    EventTooOld as EventTooOld,
)
from receiver.core.errors import (
    HandlerTransactionError as HandlerTransactionError,
)
from receiver.core.errors import (
    HookledgerError as HookledgerError,
)
from receiver.core.errors import (
    MalformedEvent as MalformedEvent,
)
from receiver.core.errors import (
    NotTheAccounts as NotTheAccounts,
)
from receiver.core.errors import (
    PayloadTooLarge as PayloadTooLarge,
)
from receiver.core.errors import (
    ReceiveError as ReceiveError,
)
from receiver.core.errors import (
    RedactedEvents as RedactedEvents,
)
from receiver.core.errors import (
    SchemaNotReady as SchemaNotReady,
)
from receiver.core.errors import (
    SignatureError as SignatureError,
)
from receiver.core.errors import (
    SignatureMalformed as SignatureMalformed,
)
from receiver.core.errors import (
    SignatureMissing as SignatureMissing,
)
from receiver.core.errors import (
    StorageBusy as StorageBusy,
)
from receiver.core.errors import (
    StorageUnavailable as StorageUnavailable,
)
from receiver.core.errors import (
    UnknownEventType as UnknownEventType,
)

__all__ = [
    "HookledgerError",
    "ConfigurationError",
    "ReceiveError",
    "PayloadTooLarge",
    "SignatureError",
    "SignatureMissing",
    "SignatureMalformed",
    "MalformedEvent",
    "EventTooOld",
    "StorageUnavailable",
    "StorageBusy",
    "SchemaNotReady",
    "HandlerTransactionError",
    "NotTheAccounts",
    "UnknownEventType",
    "EventNotFound",
    "DataUnavailable",
    "DataKeyMissing",
    "DataNotAuthentic",
    "BodyRedacted",
    "RedactedEvents",
]
