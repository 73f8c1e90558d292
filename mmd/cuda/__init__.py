"""Everything in mmd that talks to the CUDA driver, through pycuda: the only package that imports it.

* :mod:`.driver`: pycuda imported lazily, device count, error text, a device's context and stream in one
  thread;
* :mod:`.compiler`: nvcc and mmd's disk cache of compiled kernels;
* :mod:`.session`: :class:`GpuSession`, one device in one thread, made of the parts below;
* :mod:`.device`: the device's limits, name, versions and free memory (``session.device``);
* :mod:`.memory`: device matrices, raw buffers, page-locked host buffers and the copies between them
  (``session.memory``), over :mod:`.pools` (what a session keeps from job to job);
* :mod:`.modules`: kernels loaded in the session's context (``session.modules``);
* :mod:`.stream`: launches, cuBLAS, events and phase timers on the session's stream (``session.stream``);
* :mod:`.cublas`: SGEMM and DGEMM through ctypes;
* :mod:`.text`: parsing and formatting the text formats on the GPU (``session.text``);
* :mod:`.libcuda`: the driver API beside pycuda (ctypes): tensor maps, cluster launches, and the
  context a one-shot job starts beside its imports.

The backend (:mod:`mmd.backends.cuda`) holds the job's logic and sees only a
session; tests give it a fake one (tests/fakes.py).

The package itself imports nothing: `mmd run` imports :mod:`.libcuda` to start
the GPU before numpy is imported, and a package that pulled in its siblings
would import numpy first.
"""
