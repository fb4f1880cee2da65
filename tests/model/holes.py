"""Rules of the world model that hit a hole still open on main (one of issue 28's, or one
this machine found), narrowed meanwhile.

Each flag turns off (or narrows) the rule that finds its hole, never an invariant, so that
the machine passes on main meanwhile. When the hole's fix lands on main, its flag goes (and
so do its uses): ``git grep holes.NEW_`` lists them. The ten holes of issue 28 are fixed on
main; the flags left are the machine's own findings (see /work/wt/model-findings.md).
"""

from __future__ import annotations

#: Not one of the ten (found by this machine): when no webhook has reached hookledger since
#: the deploy (its first attempts lost on the way), ``reconcile adopt`` takes the cut-over
#: for the end of history and writes off every change since the deploy: a payment paid
#: after it is recorded as seen, its retry is stale, no path dispatches it. The README's
#: premise ("the processor makes its first attempt at an event within seconds of it ... so
#: everything from there on was sent to hookledger") does not hold when that attempt never
#: arrives. Narrowed: an account is adopted only when, if the processor sent it a webhook
#: since its deploy, one reached hookledger within five minutes of the first.
NEW_ADOPT_BEFORE_ANY_DELIVERY = True
