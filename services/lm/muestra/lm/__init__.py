"""muestra's lm service."""
