"""Who this device is: a stable device id, its credentials, and enrollment (pairing).

device.py: the id; credentials.py: the token on disk; enrollment.py: the pairing
rules (sans I/O); enroller.py: the HTTPS requests and the thread that runs them.
"""
