"""The package version, in one place (setup.cfg reads it with ``attr:``; nothing here imports the package)."""

__version__ = "0.1.0"
