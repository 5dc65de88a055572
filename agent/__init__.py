"""edge-agent: keeps signage and IoT players linked to their fleet server."""

__version__ = "0.2.3"
