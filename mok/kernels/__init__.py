"""The CUDA backend: the swizzle kernel (mxfp8_swizzle.cu), what a compiled kernel is and which one
a launch takes (config), its work as jobs and their descriptor table (jobs), and the NVRTC
compilation at first use and the launch (launch); the BF16-to-MXFP8 kernel (mxfp8_quantize.cu)
and its launch (quantize); the MXFP8 export kernel (mxfp8_export.cu), its jobs (export_jobs) and
launch (export_launch); the headers they include (async_copy.cuh)."""

from importlib import resources


def include_path() -> str:
    """The folder of the kernels' shared headers (async_copy.cuh), NVRTC's include path."""
    return str(resources.files(__name__))
