"""The version of flakekit, in one place: the build (pyproject's dynamic version), the
package (``flakekit.__version__``) and ``flakekit --version`` read it from here."""

__version__ = "0.1.0"
