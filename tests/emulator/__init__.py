"""The CPU emulator of mok's CUDA kernel (emulate.py): a test tool, not part of the package."""
