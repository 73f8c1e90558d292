"""``python -m mmd``: the same as the ``mmd`` console script."""

from .cli import entry

if __name__ == "__main__":
    entry()
