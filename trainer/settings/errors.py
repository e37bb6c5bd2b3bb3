"""The settings' error: a value that is invalid, with a message that names the flag and what to change."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the flag and what to change."""


def require(ok: bool, message: str) -> None:
    """Raises `ConfigError(message)` unless `ok`."""
    if not ok:
        raise ConfigError(message)
