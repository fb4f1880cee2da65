"""A small shop whose orders are driven purely by payment-processor events."""
