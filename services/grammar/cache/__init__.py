"""The compile cache: the in-process LRU and single flight (grammar_cache.py, keycache.py), the
Redis store (store.py) and its records (records.py), compile limits and cold slots (limits.py),
builds (builders.py) in compile child processes (isolation.py, compile_child.py)."""
