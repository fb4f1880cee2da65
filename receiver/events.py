"""The public path of typed, frozen webhook events: re-exports :mod:`receiver.core.events`, where
the code lives (see docs/architecture.md)."""

from receiver.core.events import (
    CONTENT_TYPE_FOR_CLASS as CONTENT_TYPE_FOR_CLASS,
)
from receiver.core.events import (
    CONTENT_TYPES as CONTENT_TYPES,
)
from receiver.core.events import (
    EVENT_CLASSES as EVENT_CLASSES,
)
from receiver.core.events import (
    EVENT_TYPES as EVENT_TYPES,
)
from receiver.core.events import (
    MAX_EVENT_ID_LENGTH as MAX_EVENT_ID_LENGTH,
)
from receiver.core.events import (
    RESOURCE_TYPES as RESOURCE_TYPES,
)
from receiver.core.events import (
    Dispute as Dispute,
)
from receiver.core.events import (
    Event as Event,
)
from receiver.core.events import (
    Invoice as Invoice,
)
from receiver.core.events import (
    Mandate as Mandate,
)
from receiver.core.events import (
    ObjectRef as ObjectRef,
)
from receiver.core.events import (
    Payment as Payment,
)
from receiver.core.events import (
    Payout as Payout,
)
from receiver.core.events import (
    Refund as Refund,
)
from receiver.core.events import (
    Resource as Resource,
)
from receiver.core.events import (
    Subscription as Subscription,
)
from receiver.core.events import (
    json_type as json_type,
)
from receiver.core.events import (
    parse_event as parse_event,
)
from receiver.core.events import (
    parse_timestamp as parse_timestamp,
)
from receiver.core.events import (
    validate_event_type as validate_event_type,
)

__all__ = [
    "CONTENT_TYPES",
    "CONTENT_TYPE_FOR_CLASS",
    "EVENT_CLASSES",
    "EVENT_TYPES",
    "MAX_EVENT_ID_LENGTH",
    "RESOURCE_TYPES",
    "Dispute",
    "Event",
    "Invoice",
    "Mandate",
    "ObjectRef",
    "Payment",
    "Payout",
    "Refund",
    "Resource",
    "Subscription",
    "parse_event",
    "validate_event_type",
    "parse_timestamp",
    "json_type",
]
