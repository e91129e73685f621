"""The version of ddpdoctor, in a module of its own so lower layers never import the package root."""

__version__ = "0.1.0"
