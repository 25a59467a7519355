"""muestra's tokenizer service."""
