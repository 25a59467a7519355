"""Text generation in the gateway: the queue and loop of each lm replica, and what it is made of.

See docs/architecture.md (The gateway's generation engine) for which file owns what.
"""
