"""The CUDA backend: kernel source compiled at first use with NVRTC (cuda.core)."""
