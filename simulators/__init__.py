"""Data, not code: hardware presets, framework profiles and ASTRA-sim templates.

Installed as the package ``stageopt.simulators`` (see setup.py) so that
importlib.resources finds these files in a wheel as in a checkout.
"""
