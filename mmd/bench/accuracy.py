"""The accuracy sweep (``mmd bench --accuracy``): each kernel's error against float64 over K."""

from __future__ import annotations

import dataclasses
import sys
import traceback
from collections.abc import Iterator, Mapping

import numpy as np

from .. import kernels as registry
from ..backends.base import Backend, MultiplyRequest
from ..check import full
from ..check.product import reference
from ..errors import MmdError
from ..kernelchoice import KernelChoice
from .checking import check_product
from .plan import Plan, backend_for, cannot_run
from .progress import ProgressSink
from .rows import AccuracyRow

#: Kernels the sweep measures beside the chosen ones on a GPU backend: cuBLAS in both modes.
ACCURACY_REFERENCES: tuple[str, ...] = ("cublas", "cublas_tf32")


def accuracy_inputs(m: int, k: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The sweep's A and B: uniform in [−1, 1] (the usual GEMM accuracy test), seeded by the shape."""
    rng = np.random.default_rng([seed, m, k, n, 1])  # 1: not the timed cases' stream
    return (
        rng.uniform(-1.0, 1.0, (m, k)).astype(np.float32),
        rng.uniform(-1.0, 1.0, (k, n)).astype(np.float32),
    )


def accuracy_kernels(plan: Plan, backend: Backend) -> tuple[KernelChoice, ...]:
    """The plan's kernels and, on a GPU backend, :data:`ACCURACY_REFERENCES`: mmd's own in registry order, then the
    kernel files in the order given."""
    names = {c.name for c in plan.choices} | (set(ACCURACY_REFERENCES) if backend.name != "cpu" else set())
    own = tuple(KernelChoice.builtin(n) for n in registry.NAMES if n in names)
    return own + plan.kernel_files


def error_stats(c: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """``max_rel_error`` = max|C − ref| / max|ref|, ``rms_rel_error`` = ‖C − ref‖ / ‖ref‖, ``max_abs_error``.

    Both relative errors are normalised by the whole product, not element by
    element: an element near zero would otherwise stand for the kernel.
    """
    diff = c.astype(np.float64) - ref
    top, norm = float(np.abs(ref).max()), float(np.linalg.norm(ref))
    worst = float(np.abs(diff).max())
    return {
        "max_rel_error": float(f"{worst / top if top else worst:.4g}"),
        "rms_rel_error": float(f"{float(np.linalg.norm(diff)) / norm if norm else 0.0:.4g}"),
        "max_abs_error": float(f"{worst:.4g}"),
    }


def run_accuracy(
    plan: Plan,
    backend: Backend,
    host: Backend,
    files: Mapping[KernelChoice, Backend] | None = None,
    progress: ProgressSink | None = None,
) -> Iterator[AccuracyRow]:
    """Each kernel's error against float64 at M = N = ``plan.accuracy_mn`` for every K of ``plan.accuracy_ks``.

    Yields one row per kernel and K. A kernel's first call at a shape
    compiles or warms it up; the product is a product all the same, so one
    call is enough. ``within_fp32_tolerance``: every element within fp32's
    tolerance (:func:`mmd.check.full.fp32_tolerance`), the bar a fp32-class
    kernel is held to; TF32 kernels are expected to miss it. ``files``: each
    kernel file's backend (:func:`run_plan` makes them).
    """
    mn = plan.accuracy_mn
    for k in plan.accuracy_ks:
        a, b = accuracy_inputs(mn, k, mn, plan.seed)
        ref = reference(a, b)
        allowed = full.fp32_tolerance(a, b)
        for choice in accuracy_kernels(plan, backend):
            tile = plan.sizes_at_tile if choice.uses_tile else None
            use = backend_for(choice, backend, host, files or {})
            row = AccuracyRow(kernel=choice.name, backend=use.name, tile=tile, m=mn, k=k, n=mn)
            reason = cannot_run(choice, use)
            if reason is not None:
                row = dataclasses.replace(row, status="skipped", reason=reason)
            else:
                request = MultiplyRequest(kernel=choice.name, tile=tile or plan.sizes_at_tile, memory=plan.memory)
                row = _measure(row, use, request, a, b, ref, allowed)
            row = dataclasses.replace(row, device=use.device_name())  # a kernel file's, once its process named it
            if progress is not None:
                progress.accuracy(row)
            yield row


def _measure(
    row: AccuracyRow,
    backend: Backend,
    request: MultiplyRequest,
    a: np.ndarray,
    b: np.ndarray,
    ref: np.ndarray,
    allowed: np.ndarray,
) -> AccuracyRow:
    try:
        c = backend.multiply(a, b, request).c
    except MmdError as exc:
        return dataclasses.replace(row, status="refused", reason=exc.reason)
    except Exception as exc:  # a bug must not cost the rest of the sweep
        traceback.print_exc(file=sys.stderr)
        return dataclasses.replace(row, status="error", reason=f"{type(exc).__name__}: {exc}")
    within = check_product(c, ref, allowed, "").ok
    stats = error_stats(c, ref)
    return dataclasses.replace(
        row,
        max_rel_error=stats["max_rel_error"],
        rms_rel_error=stats["rms_rel_error"],
        max_abs_error=stats["max_abs_error"],
        within_fp32_tolerance=within,
    )
