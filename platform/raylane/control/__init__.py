"""The control plane: the detached control actor, its journal and records, and the client to reach it."""
