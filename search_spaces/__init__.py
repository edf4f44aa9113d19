"""Data, not code: the shipped search spaces (see README.md here).

Installed as the package ``stageopt.search_spaces`` (see setup.py) so that
importlib.resources finds these files in a wheel as in a checkout.
"""
