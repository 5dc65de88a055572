"""Remote operations: the fleet server asks the screen to act (docs/PROTOCOL.md)."""
