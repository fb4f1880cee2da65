"""The reads of the reconciler's runs see its run table through a table clause of their own
(the receiver never imports the reconciler): every column they name exists in the
reconciler's model with the same name and a compatible type."""

from __future__ import annotations

from receiver.storage.recon_run_reads import RECON_RUN
from reconcile.storage.tables import ReconcileRun


def test_the_run_table_clause_matches_the_reconcilers_model() -> None:
    model = ReconcileRun.__table__  # type: ignore[attr-defined]
    assert RECON_RUN.name == model.name
    for column in RECON_RUN.columns:
        assert column.name in model.columns, column.name
        mine, theirs = column.type, model.columns[column.name].type
        assert mine._type_affinity is theirs._type_affinity, (column.name, mine, theirs)
