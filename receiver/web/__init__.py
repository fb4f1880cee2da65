"""The Flask side: the extension, the receive blueprint, the ops console and the metrics."""
