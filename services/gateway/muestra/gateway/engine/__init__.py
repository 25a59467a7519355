"""The engine side: one typed request in (request.py), its stream of outputs back (the schedulers under
generation/), with the sampler chain (sampling/), output constraints (constraints/), speculative proposers
(proposers/), the served models and their clients (backends.py) and the prefix cache (prefix.py)."""
