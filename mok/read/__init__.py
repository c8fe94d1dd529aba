"""The read stage: TE's weights (or BF16 ones) read once into a snapshot, every tensor's memory as
the view's checks saw it (mok.read.memory), by te_compat's geometry (mok.read.blocks)."""
