"""A stand-in for pycuda (tests/fakegpu/pycuda/driver.py)."""
