"""The plan and guard stage: the one pipeline (mok.plan.pipeline) plans a view's buffers and work
from a snapshot, runs it (mok.plan.work: one kernel launch on CUDA), and keeps it under a guard of
exactly what was read (mok.plan.guard), which a refresh checks before it reruns the launch."""
