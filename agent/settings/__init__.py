"""Settings from the fleet: a revision of agent.toml's keys the server sends, kept as an
overlay in the state directory (the local file stays the base), on trial until the link
proves itself with it, rolled back to the last good revision if it does not.

rules.py: the trial's verdict, sans I/O; service.py: the decisions over the overlay
file, which stage, keep and roll back; trial.py: their orchestration (the configure
command, the alarms). A revision's shape and expiries, and the overlay file, are the
configuration's (config/revision.py, config/overlay.py): root reads them too.
"""
