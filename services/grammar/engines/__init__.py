"""The matcher interface (engine.py) and its xgrammar and llguidance implementations, the Lark
emission llguidance compiles (lark.py), batched mask fills (batch.py) and walks through a compiled
constraint (matching.py)."""
