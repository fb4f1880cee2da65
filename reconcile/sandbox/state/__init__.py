"""The sandbox processor's state and behaviour: :class:`Sandbox` (its docstring describes
the behaviour), one class composed of a mixin per area of the API over a shared base.

- :mod:`~reconcile.sandbox.state.sandbox`: :class:`Sandbox`, the mixins composed.
- :mod:`~reconcile.sandbox.state.base`: the constructor, lock, configuration and lifecycle,
  stats, the stores, lookups, status changes and their webhooks, the id generator.
- :mod:`~reconcile.sandbox.state.payments`: payments and the payment state machine.
- :mod:`~reconcile.sandbox.state.payment_lists`: the payment lists, both dialects.
- :mod:`~reconcile.sandbox.state.payment_method_data`: a request's card, read and checked.
- :mod:`~reconcile.sandbox.state.refunds`: refunds and the refund list.
- :mod:`~reconcile.sandbox.state.payouts`: payouts and the payout lists.
- :mod:`~reconcile.sandbox.state.payout_methods`: ``payout_method_data`` as answers show it.
- :mod:`~reconcile.sandbox.state.disputes`: disputes, their actions and stages, the list.
- :mod:`~reconcile.sandbox.state.mandates`: customers and their card mandates.
- :mod:`~reconcile.sandbox.state.events_api`: the admin events API.
- :mod:`~reconcile.sandbox.state.time_passing`: :meth:`Sandbox.tick`.
- :mod:`~reconcile.sandbox.state.seeding`: :meth:`Sandbox.seed_payments`.
"""

from reconcile.sandbox.errors import SandboxError
from reconcile.sandbox.state.sandbox import Sandbox

__all__ = ["Sandbox", "SandboxError"]
