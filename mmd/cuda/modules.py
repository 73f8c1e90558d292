"""The kernels a session has loaded: the registry's builds, the text kernels' modules and kernel files'
cubins, each loaded once in the session's context."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from ..errors import CudaError, KernelError
from ..kernels import KernelSpec
from ..resources import kernels_dir
from .compiler import Compiled, KernelCache, Module, macro_options
from .driver import Context, one_line

#: pycuda's argument signature of every matmul kernel: A, B, C, M, K, N, lda, ldb, ldc.
MATMUL_SIGNATURE = "PPPiiiiii"

T = TypeVar("T")


class Modules:
    """``session.modules``: CUDA sources built for the device (mmd's disk cache, ``cache``, beneath) and
    cubins built elsewhere, loaded into the session's context; unloaded at :meth:`close`.

    ``arch``: the device's (``sm_90``).
    """

    def __init__(self, context: Context, cache: KernelCache, arch: str) -> None:
        self._context = context
        self.cache = cache
        self._arch = arch
        self._modules: dict[tuple[Any, ...], Module] = {}
        self._compiled: dict[tuple[Any, ...], Compiled] = {}
        self._driver_modules: list[int] = []  # CUmodules loaded through libcuda, unloaded in close()

    def module(
        self, source: Path, defines: Mapping[str, int], entries: Mapping[str, str], arch: str | None = None
    ) -> tuple[Module, bool]:
        """``source`` built with ``defines`` for ``arch`` (default: this device's), its ``entries`` prepared.

        ``entries`` maps each entry symbol to its pycuda argument signature.
        Returns the module and whether it was loaded just now (else it came
        from this session's cache). mmd's disk cache (:class:`KernelCache`)
        sits beneath; a cached cubin the driver refuses is rebuilt once.
        """
        self._context.check()
        arch = arch or self._arch
        options = macro_options(defines)
        key = (str(source), options, arch, tuple(sorted(entries.items())))
        cached = self._modules.get(key)
        if cached is not None:
            return cached, False
        start = time.perf_counter()
        try:
            loaded = self._loaded(
                source, options, arch, self._context.cuda.module_from_buffer, self._context.cuda.Error
            )
            functions = {}
            for name, signature in entries.items():
                function = loaded.get_function(name)
                function.prepare(signature)
                functions[name] = function
        except KernelError as exc:
            raise KernelError(f"{source.name} does not compile: {exc.reason}", dict(exc.details)) from exc
        except self._context.cuda.Error as exc:
            raise CudaError(f"loading {source.name} failed: {one_line(exc)}") from exc
        module = Module(functions, (time.perf_counter() - start) * 1e3)
        self._modules[key] = module
        return module, True

    def _loaded(
        self,
        source: Path,
        options: tuple[str, ...],
        arch: str,
        load_cubin: Callable[[bytes], T],
        refused: type[BaseException] | tuple[type[BaseException], ...],
    ) -> T:
        """``source``'s cubin from mmd's disk cache (built there if missing), loaded by ``load_cubin``; a cached
        cubin the driver refuses (``refused``) is rebuilt once."""
        text = source.read_text(encoding="utf-8")
        include = [str(kernels_dir())]
        cubin, built = self.cache.get(text, options, arch, include)
        try:
            return load_cubin(cubin)
        except refused:
            if built:
                raise
        cubin, _ = self.cache.get(text, options, arch, include, refresh=True)
        return load_cubin(cubin)

    def compile(self, spec: KernelSpec, tile: int) -> tuple[Compiled, bool]:
        """Registry kernel ``spec``, as built for this device (:meth:`KernelSpec.for_arch`), at ``tile``; and whether
        it was built just now.

        Kernels with a fixed block ignore the tile: one build serves every
        tile. A TMA build is loaded through libcuda, and the build it falls back
        to is built with it, so that :meth:`~mmd.cuda.stream.Stream.multiply` never compiles.
        """
        if spec.source is None or spec.entry is None:
            raise KernelError(f"kernel {spec.name} has no CUDA source to compile")
        spec = spec.for_arch(self._arch)
        tile = tile if spec.uses_tile else 0
        key = (spec.name, spec.variant, tile)
        cached = self._compiled.get(key)
        if cached is not None:
            return cached, False
        fallback_ms = 0.0
        if spec.fallback is not None:
            fallback, built = self.compile(spec.fallback, tile)
            fallback_ms = fallback.compile_ms if built else 0.0
        try:
            if spec.tensor_maps is not None:
                compiled = self._compile_tma(spec, tile)
            else:
                compiled = self._compile_pycuda(spec, tile)
        except KernelError as exc:
            raise KernelError(
                f"kernel {spec.name} does not compile at tile {tile}: {exc.reason}",
                details={"kernel": spec.name, "tile": tile},
            ) from exc
        compiled.compile_ms += fallback_ms
        self._compiled[key] = compiled
        return compiled, True

    def load_cubin(self, cubin: bytes, symbol: str, signature: str, dynamic_shared: int = 0) -> Any:
        """Function ``symbol`` of a cubin built elsewhere (a kernel file's, by NVRTC), loaded into this session's
        context, prepared with its pycuda argument ``signature`` and allowed ``dynamic_shared`` bytes of dynamic
        shared memory; launch it with :meth:`~mmd.cuda.stream.Stream.launch`."""
        self._context.check()
        with self._context.converting(f"loading {symbol}"):
            function = self._context.cuda.module_from_buffer(cubin).get_function(symbol)
            function.prepare(signature)
            if dynamic_shared:
                function.set_attribute(
                    self._context.cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic_shared
                )
        return function

    def _compile_pycuda(self, spec: KernelSpec, tile: int) -> Compiled:
        """A build with the common argument list, loaded and launched through pycuda."""
        assert spec.source is not None and spec.entry is not None  # compile() checked
        module, _ = self.module(
            spec.source, spec.defines(tile), {spec.entry: MATMUL_SIGNATURE}, spec.arch_for(self._arch)
        )
        function = module.functions[spec.entry]
        if spec.dynamic_shared_bytes:
            with self._context.converting(f"allowing {spec.name} {spec.dynamic_shared_bytes} bytes of shared memory"):
                function.set_attribute(
                    self._context.cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, spec.dynamic_shared_bytes
                )
        return Compiled(
            spec=spec,
            tile=tile,
            function=function,
            registers=int(function.num_regs),
            shared_bytes=int(function.shared_size_bytes),
            local_bytes=int(function.local_size_bytes),
            compile_ms=module.load_ms,
        )

    def _compile_tma(self, spec: KernelSpec, tile: int) -> Compiled:
        """A TMA build: its CUfunction (an int) through libcuda, which alone can pass it tensor maps."""
        assert spec.source is not None and spec.entry is not None  # compile() checked
        start = time.perf_counter()
        driver = self._context.driver()
        arch = spec.arch_for(self._arch)
        try:
            module = self._loaded(spec.source, macro_options(spec.defines(tile)), arch, driver.load_module, CudaError)
        except KernelError as exc:
            raise KernelError(f"{spec.source.name} does not compile: {exc.reason}", dict(exc.details)) from exc
        self._driver_modules.append(module)
        function = driver.function(module, spec.entry, spec.dynamic_shared_bytes)
        used = driver.resources(function)
        return Compiled(
            spec=spec,
            tile=tile,
            function=function,
            registers=used.registers,
            shared_bytes=used.shared_bytes,
            local_bytes=used.local_bytes,
            compile_ms=(time.perf_counter() - start) * 1e3,
        )

    def close(self) -> list[BaseException]:
        """Drop every module (the session is closing); what failed to unload."""
        problems: list[BaseException] = []
        self._modules.clear()
        self._compiled.clear()
        while self._driver_modules:
            try:
                self._context.driver().unload_module(self._driver_modules.pop())
            except CudaError as exc:
                problems.append(exc)
        return problems
