"""muestra's gateway service."""
