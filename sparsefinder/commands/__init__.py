"""Subcommands of the `sparsefinder` CLI: one module each, discovered by :mod:`sparsefinder.cli`."""
