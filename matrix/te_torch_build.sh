# What building TE's torch extension from its source needs, shared by matrix/gpu_live.sh (on the
# GPU machine) and matrix/prebuild_te_torch.sh (here). Sourced, defines functions only.

# NVTE_PYTORCH_FORCE_BUILD for a torch extension's source archive: TRUE, except for TE 2.9.x,
# whose setup.py runs bdist_wheel a second time after a forced build (its CachedWheelsCommand
# lacks the `return` TE 2.10 added) and fails, the first run having moved the library away;
# unforced, it tries to download a prebuilt wheel first (offline: it fails at once) and builds once.
force_build() { [[ $(basename "$1") == transformer_engine_torch-2.9.* ]] && echo FALSE || echo TRUE; }
