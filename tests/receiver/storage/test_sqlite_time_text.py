"""The inbox's times on SQLite are written by :func:`utc_text` on the receive path and by
SQLAlchemy's column processors everywhere else (reads compare them as text): the two must
write the same text for every time, or a claim's ``next_attempt_at <= now`` would order
rows written by the two paths wrongly."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.dialects import sqlite

from receiver.storage.sql.sqlite import utc_text
from receiver.storage.sql.tables import EVENT

_DIALECT = sqlite.dialect()
_SQLALCHEMY = EVENT.c.next_attempt_at.type.dialect_impl(_DIALECT).bind_processor(_DIALECT)

_ZONES = st.one_of(
    st.just(UTC),
    st.builds(
        timezone,
        st.timedeltas(min_value=timedelta(hours=-23, minutes=-59), max_value=timedelta(hours=23)),
    ),
)
#: Far enough from the calendar's ends that UTC is still a datetime.
_TIMES = st.datetimes(
    min_value=datetime(2, 1, 1), max_value=datetime(9998, 12, 31), timezones=_ZONES
)


@given(_TIMES)
def test_utc_text_is_sqlalchemys_text(value: datetime) -> None:
    assert utc_text(value) == _SQLALCHEMY(value)


def test_whole_seconds_keep_their_microseconds() -> None:
    value = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=2)))
    assert utc_text(value) == "2026-01-02 01:04:05.000000" == _SQLALCHEMY(value)


def test_none_and_naive_times() -> None:
    assert utc_text(None) is None is _SQLALCHEMY(None)
    with pytest.raises(ValueError, match="timezone"):
        utc_text(datetime(2026, 1, 1))  # noqa: DTZ001 - the naive time refused
    with pytest.raises(ValueError, match="timezone"):
        _SQLALCHEMY(datetime(2026, 1, 1))  # noqa: DTZ001


def test_every_time_column_written_by_utc_text_takes_sqlalchemys_text() -> None:
    # utc_text stands in for each column's own processor on the receive path: every column
    # it is chosen for must have written the same text (a column of another time type would
    # otherwise be stored in a form its reads do not expect).
    from receiver.storage.sql.sqlite import SQLiteStatements

    replaced = [name for name, bind in SQLiteStatements()._event_binds if bind is utc_text]
    assert replaced == ["event_time", "object_created_at", "received_at", "next_attempt_at"]
    value = datetime(2026, 3, 4, 5, 6, 7, 89, tzinfo=timezone(timedelta(hours=-7)))
    for name in replaced:
        own = EVENT.c[name].type.dialect_impl(_DIALECT).bind_processor(_DIALECT)
        assert own is not None and own(value) == utc_text(value), name


_MAYBE_TIMES = st.one_of(st.none(), _TIMES)


@given(
    event_time=_MAYBE_TIMES, created=_MAYBE_TIMES, received=_TIMES, later=_MAYBE_TIMES,
    shared=st.booleans(),
)  # fmt: skip
def test_a_bound_row_is_each_column_bound_alone(
    event_time: datetime | None,
    created: datetime | None,
    received: datetime,
    later: datetime | None,
    shared: bool,
) -> None:
    """:meth:`SQLiteStatements.bound_event` takes the values in one call and writes a time
    shared by two columns once: each value is still what its column's processor makes."""
    from receiver.storage.sql.sqlite import SQLiteStatements

    sql = SQLiteStatements()
    values = {name: f"{name} value" for name, _ in sql._event_binds}
    values.update(
        event_time=event_time,
        object_created_at=created,
        received_at=received,
        next_attempt_at=received if shared else later,
    )
    one_by_one = [bind(values[name]) if bind else values[name] for name, bind in sql._event_binds]
    assert sql.bound_event(values) == one_by_one
