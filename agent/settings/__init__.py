"""Settings from the fleet: a revision of agent.toml's keys the server sends, kept as an
overlay in the state directory (the local file stays the base), on trial until the link
proves itself with it, rolled back to the last good revision if it does not.

rules.py: a revision's shape, expiries and the trial's verdict, sans I/O; store.py: the
overlay file; service.py: the agent's side, which stages, keeps and rolls back.
"""
