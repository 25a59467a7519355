"""The API side over gRPC: the Gateway service (server.py) and its Tokenize and Detokenize calls (tokenize.py)."""
