"""Everything in mmd that talks to the CUDA driver, through pycuda: the only package that imports it.

* :mod:`.driver`: pycuda imported lazily, device count, error text;
* :mod:`.compiler`: nvcc and mmd's disk cache of compiled kernels;
* :mod:`.memory`: device matrices and page-locked host buffers;
* :mod:`.cublas`: SGEMM and DGEMM through ctypes;
* :mod:`.text`: parsing and formatting the text formats on the GPU;
* :mod:`.session`: :class:`GpuSession`, one device in one thread, which ties them together;
* :mod:`.libcuda`: the driver API beside pycuda (ctypes): tensor maps, cluster launches, and the
  context a one-shot job starts beside its imports.

The backend (:mod:`mmd.backends.cuda`) holds the job's logic and sees only a
session; tests give it a fake one (tests/fakes.py).

The package itself imports nothing: `mmd run` imports :mod:`.libcuda` to start
the GPU before numpy is imported, and a package that pulled in its siblings
would import numpy first.
"""
