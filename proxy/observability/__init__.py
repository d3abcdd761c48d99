"""What the proxy says of itself: Prometheus metrics, their bounded labels, and JSON logs."""
