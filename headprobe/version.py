"""headprobe's version, one owner: the package, its metadata (pyproject reads it) and reports.

    from headprobe.version import __version__

A leaf module (it imports nothing), so that results and report code can name the version
without importing the package's top level.
"""

__version__ = "0.1.0"
