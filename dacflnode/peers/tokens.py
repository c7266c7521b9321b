"""The bearer tokens a peers file names: their form, and reading ``node.metrics_token_file``.

A token (``node.control_token``, ``node.metrics_token`` or the one line of
``node.metrics_token_file``) is at least :data:`TOKEN_MIN` printable ASCII characters without
spaces (:data:`TOKEN_RE`). No message here echoes a token: it is a secret.
"""

from __future__ import annotations

import re
from pathlib import Path

from dacflnode.errors import ConfigError

__all__ = ["TOKEN_MIN", "TOKEN_RE", "read_metrics_token"]

#: The fewest characters of a token.
TOKEN_MIN = 16
#: What a token is: printable ASCII without spaces, 16 to 4096 characters.
TOKEN_RE = re.compile(rf"[\x21-\x7e]{{{TOKEN_MIN},4096}}")


def read_metrics_token(path: Path, peers_file: Path) -> str:
    """The token in ``node.metrics_token_file`` ``path`` (surrounding blanks and the final
    newline dropped). The file must not be open to other users (a Kubernetes Secret's 0440 is
    fine: the group is the pod's). Raises :class:`ConfigError` naming the setting and the file,
    never the value."""
    field = "node.metrics_token_file"
    try:
        mode = path.stat().st_mode
        with path.open("rb") as f:
            data = f.read(8192)
    except OSError as exc:
        raise ConfigError(field, f"in {peers_file}: cannot read {path}: {exc.strerror}: write "
                          "the token there (one line) or fix the file's permissions") from None
    if mode & 0o007:
        raise ConfigError(field, f"in {peers_file}: {path} is open to other users (mode "
                          f"{mode & 0o777:o}): chmod 600 {path}")
    token = data.decode("ascii", errors="replace").strip()
    if not TOKEN_RE.fullmatch(token):
        raise ConfigError(field, f"in {peers_file}: {path} must hold one token of at least "
                          f"{TOKEN_MIN} printable ASCII characters without spaces (got "
                          f"{len(token)} characters)")
    return token
