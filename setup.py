"""The one compiled piece, optional: mok's reader of tensors' memory facts (mok/read/_fingerprint.c).

It needs a C compiler and Python's headers at install time, and no torch headers. Where it does not
build, the install goes on without it and mok reads the same facts in Python (mok/read/fingerprint.py).
Everything else is declared in pyproject.toml.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("mok.read._fingerprint", ["mok/read/_fingerprint.c"], optional=True)])
