"""``python -m receiver.alerts``: print where the installed rules file is."""

from receiver.alerts import RULES_FILE

print(RULES_FILE)
