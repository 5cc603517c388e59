"""Speculative proposers (n-gram copy, MTP, DFlash, DFlash2).

Proposers produce drafts (and, for DFlash2, the sparse q over their candidates), never masks: the
target is constrained, drafts are not. The Program's masks fill K+1 lookahead positions along the
proposal chain and its acceptance stage verifies them. Chosen by a plain if/elif on the engine's
configuration. Nothing is implemented here yet: the engine rejects speculative configurations.
"""
