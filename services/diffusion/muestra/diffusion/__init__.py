"""muestra's diffusion service."""
