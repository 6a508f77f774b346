"""Model formats Roller reads: each turns a model into a ``roller.graph.Graph``."""
