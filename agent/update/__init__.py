"""Self-update: signed packages from the fleet, proven or rolled back (rules.py)."""
