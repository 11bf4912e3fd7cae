"""Bundled data files, shipped as the package ``sparsefinder.assets`` (see pyproject.toml).

Read them through :mod:`sparsefinder.bundle`, which lists them in ``bundle.json`` manifests.
"""
