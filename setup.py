"""Install the dbwrap_py package and its adapters into the project's venv.

The package lives in python/dbwrap_py; the adapters in the top-level adapters/
folder are installed as dbwrap_py.adapters, so that a short name such as
"tdb" resolves to dbwrap_py.adapters.tdb.
"""

from setuptools import Extension, setup

# tdb chainlocks for the tdb adapter (python3-tdb lacks them; ctypes is slow)
tdb_chainlock = Extension(
    "dbwrap_py.adapters._tdb_chainlock",
    sources=["adapters/_tdb_chainlock.c"],
    libraries=["tdb"],
)

setup(
    name="dbwrap_py",
    version="0.1.0",
    description="Samba dbwrap backends written in Python",
    python_requires=">=3.11",
    packages=["dbwrap_py", "dbwrap_py.adapters"],
    package_dir={"dbwrap_py": "python/dbwrap_py", "dbwrap_py.adapters": "adapters"},
    ext_modules=[tdb_chainlock],
    entry_points={"console_scripts": ["dbwrap-py = dbwrap_py.cli:main"]},
)
