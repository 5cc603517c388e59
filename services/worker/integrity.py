"""Runtime integrity errors of the worker: the Engine's state can no longer be trusted.

Design document: "Runtime integrity errors are never wrapped as user schema errors. A broken row
membership, a matcher that cannot roll back or a GPU physical commit that cannot complete keeps
the Engine's existing unavailable boundary." Raised where one is found (the OutputSession's
rollback, the commit path's Program commit, the Program's batch checks) and caught by the Engine
only, which then drains: every live request fails typed (ServiceUnavailable), health reports
unavailable, and nothing is served until the Engine has rebuilt its Program.
"""

from __future__ import annotations


class IntegrityError(RuntimeError):
    """A runtime integrity failure (see the module docstring); never a request's error."""
