"""The reference fleet server: implements docs/PROTOCOL.md on loopback for the demo and tests."""
