"""Python client for the muestra gateway."""
