"""One reconcile run (:class:`Reconciler`), adoption, and the schedule that runs them."""
