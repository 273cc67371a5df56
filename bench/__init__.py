"""The benchmarks: scripts run from the checkout (each prints its figures; docs/benchmarks.md)."""
