"""Only what pyproject.toml cannot say: the code packages are found, the data folders at the top are mapped in.

``simulators/`` and ``search_spaces/`` stay where users and the docs look for them,
and install as the packages ``stageopt.simulators`` and ``stageopt.search_spaces``
(read with importlib.resources, see ``stageopt/inputs/shipped.py``): one copy of
each file, in a wheel and in an editable install alike. Folders that hold only
data are listed too, so setuptools ships them without warning.
"""

from setuptools import find_packages, setup

DATA_PACKAGES = {"stageopt.simulators": "simulators", "stageopt.search_spaces": "search_spaces"}
DATA_FOLDERS = ["stageopt.model.presets", "stageopt.simulators.hardware", "stageopt.simulators.frameworks"]

setup(packages=find_packages(include=["stageopt", "stageopt.*"]) + list(DATA_PACKAGES) + DATA_FOLDERS,
      package_dir=DATA_PACKAGES)
