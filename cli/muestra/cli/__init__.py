"""The `muestra` command."""
