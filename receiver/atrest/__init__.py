"""Data at rest, over storage: key rotation, retention, and the rejected-deliveries log."""
