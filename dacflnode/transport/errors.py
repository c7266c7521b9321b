"""The transport errors a caller catches without loading a transport.

``dacflnode status`` and the other Control clients catch :class:`PeerUnavailable`; defining it
here, apart from :mod:`dacflnode.transport.base` (which loads the wire codec and torch), keeps
those commands quick. :mod:`dacflnode.transport.base` re-exports it.
"""

from __future__ import annotations


class PeerUnavailable(ConnectionError):
    """The neighbour could not be reached (not started yet, gone, or timed out)."""
