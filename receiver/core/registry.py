"""Handler registry: by event type, by event class, or catch-all (pure, no I/O).

Registering an unknown event type or class fails at import time, with a suggestion. A
handler takes the typed event, and optionally the SQLAlchemy session whose transaction also
records the handler's success in the ledger (so its own database writes commit exactly once).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from receiver.core.errors import ConfigurationError, UnknownEventType
from receiver.core.events import EVENT_CLASSES, EVENT_TYPES, Event, validate_event_type

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, kw_only=True, slots=True)
class HandlerSpec:
    """A registered handler. ``name`` is its identity in the per-handler ledger: keep it stable."""

    name: str
    func: Callable[..., Any] = field(repr=False)
    event_types: frozenset[str] | None = None
    classes: frozenset[str] | None = None
    wants_session: bool = False

    def matches(self, event_type: str | None) -> bool:
        if self.event_types is None and self.classes is None:
            return True
        if event_type is None:
            return False
        if self.event_types is not None and event_type in self.event_types:
            return True
        return self.classes is not None and EVENT_TYPES.get(event_type) in self.classes

    def call(self, event: Event, session: object) -> None:
        """Run the handler; ``session`` (a SQLAlchemy session) only if it takes one."""
        if self.wants_session:
            self.func(event, session)
        else:
            self.func(event)


def _wants_session(func: Callable[..., Any]) -> bool:
    try:
        params = [
            p
            for p in inspect.signature(func).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        return False
    return len(params) >= 2


class Registry:
    """Ordered handlers; :meth:`handlers_for` returns them in registration order."""

    def __init__(self) -> None:
        self._handlers: list[HandlerSpec] = []

    def __len__(self) -> int:
        return len(self._handlers)

    @property
    def handlers(self) -> tuple[HandlerSpec, ...]:
        return tuple(self._handlers)

    def on(self, *event_types: str, name: str | None = None) -> Callable[[F], F]:
        """Register a handler for one or more event types (``"payment_succeeded"``)."""
        if not event_types:
            raise UnknownEventType("on() needs at least one event type; use on_any() for all")
        types = frozenset(validate_event_type(t) for t in event_types)
        return self._decorator(name, event_types=types)

    def on_class(self, *classes: str, name: str | None = None) -> Callable[[F], F]:
        """Register a handler for every event of a class (``"payments"``, ``"refunds"``...)."""
        for cls in classes:
            if cls not in EVENT_CLASSES:
                raise UnknownEventType(
                    f"unknown event class {cls!r}; known: {', '.join(sorted(EVENT_CLASSES))}"
                )
        if not classes:
            raise UnknownEventType("on_class() needs at least one event class")
        return self._decorator(name, classes=frozenset(classes))

    def on_any(self, name: str | None = None) -> Callable[[F], F]:
        """Register a catch-all handler (it also receives event types unknown to hookledger)."""
        return self._decorator(name)

    def add(
        self,
        func: Callable[..., Any],
        *,
        name: str | None = None,
        event_types: Iterable[str] | None = None,
        classes: Iterable[str] | None = None,
    ) -> HandlerSpec:
        spec = HandlerSpec(
            name=name or f"{func.__module__}.{func.__qualname__}",
            func=func,
            event_types=None if event_types is None else frozenset(event_types),
            classes=None if classes is None else frozenset(classes),
            wants_session=_wants_session(func),
        )
        if any(h.name == spec.name for h in self._handlers):
            raise ConfigurationError(
                f"a handler named {spec.name!r} is already registered; "
                "pass name= to tell them apart"
            )
        self._handlers.append(spec)
        return spec

    def _decorator(
        self,
        name: str | None,
        *,
        event_types: frozenset[str] | None = None,
        classes: frozenset[str] | None = None,
    ) -> Callable[[F], F]:
        def register(func: F) -> F:
            self.add(func, name=name, event_types=event_types, classes=classes)
            return func

        return register

    def handlers_for(self, event_type: str | None) -> list[HandlerSpec]:
        return [h for h in self._handlers if h.matches(event_type)]
