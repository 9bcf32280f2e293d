"""The error every configuration check raises, and the check itself."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value or combination of values that cannot run; the message names them."""


def check(condition: bool, message: str) -> None:
    """Raise :class:`ConfigError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(message)
