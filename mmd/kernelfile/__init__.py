"""Kernel files: a ``.cu`` file anyone writes, read, guarded, compiled and padded for mmd to run.

* :mod:`.lexer`: the file as preprocessing tokens and comments, with the author's line numbers;
* :mod:`.sandbox`: the include guard (only mmd's empty headers, however an include is written);
* :mod:`.signature`: the ``__global__`` functions and the three signatures known without a word;
* :mod:`.declaration`: the vocabulary of arguments and launch geometry (sizes as :mod:`.expressions` of the
  tile), read from YAML by :mod:`.declaring`;
* :mod:`.reading`: :func:`~.reading.read_kernel_file`, which ties them together;
* :mod:`.nvrtc` (and :mod:`.nvrtc_child`): compiling with NVRTC under limits, cached as cubins;
* :mod:`.padding`: operands padded to what a kernel needs, with no output bit changed.

Nothing here needs a GPU.
"""
