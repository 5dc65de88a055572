"""scripts/bench: edge-agent against baselines, measured side by side in one run.

silent_drop: detection and recovery of a silently dropped connection;
faults: outage, RST storm, server SIGKILL, idle-reaping proxy, slow ACKs;
netback: network back with and without the udev wake-up;
storm: a fleet behind one address reconnecting after a server restart;
footprint: one agent idle online beside a bare client; uploads: the queue;
startup: import time and spawn to a proven link beside a bare client.
The report and its PNG timeline go to bench/results/.
"""
