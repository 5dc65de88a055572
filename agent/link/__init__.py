"""The live link to the fleet server.

Pure rules (no I/O, injected clock): core, liveness, journal, delivery, cargo.
Thin I/O shell: transport (one Socket.IO connection), sockopts, tcpinfo, runner (the link
thread) with its typed inbox and its sleep (wakeup); profiles/ map it onto each server.
"""
