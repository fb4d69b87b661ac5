"""The package version: setup.cfg reads it, saved classifiers record it."""

__version__ = "0.1.0"
