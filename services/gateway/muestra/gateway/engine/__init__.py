"""The engine side: one typed request in (requests.py: TextRequest, its fields checked once), its stream of outputs
back (engine.py), through the schedulers under generation/, the sampler chain (sampling/), output constraints
(constraints/), speculative proposers (proposers/), the clients of the other services and the served models
(clients/), and the prefix cache (prefix.py)."""
