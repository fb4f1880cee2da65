"""hookledger's Prometheus alerting rules, shipped with the package: ``hookledger.rules.yml``
beside this module (README "Operating hookledger" > "Metrics" > "Alerts").

::

    cp "$(python -m receiver.alerts)" /etc/prometheus/rules/hookledger.rules.yml

Data only: nothing here is imported by the rest of hookledger.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

#: The rules file: load it with ``rule_files:`` in ``prometheus.yml``.
RULES_FILE: Final = Path(__file__).with_name("hookledger.rules.yml")

__all__ = ["RULES_FILE"]
