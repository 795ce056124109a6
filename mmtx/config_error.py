"""The error a config value that cannot work raises: `mmtx.config_check`'s start-up checks, and
the data modules' own refusals once they have read their data."""


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key and the values allowed."""
