"""The CUDA backend: the kernel (mxfp8_swizzle.cu), what a compiled kernel is and which one a launch
takes (config), its work as jobs and their descriptor table (jobs), and the NVRTC compilation at
first use and the launch (launch)."""
