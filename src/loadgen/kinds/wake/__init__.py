"""`loadgen wake`: a server waking from sleep (docs/wake.md)."""
