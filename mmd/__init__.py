"""mmd: a matrix-multiply batch processor for GPU lab machines."""

__version__ = "0.1.0"
