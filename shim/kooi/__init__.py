"""kooi: harden hosts that run AI coding agents and their builds, and run those builds."""

__version__ = "0.1.0"
