"""The live link to the fleet server.

Pure rules (no I/O, injected clock): backoff, liveness, journal, core.
Thin I/O shell: transport (one Socket.IO connection), sockopts, runner (the link thread).
"""
