"""The project's tests, laid out as the packages are: tests/te_compat, tests/mok (with plan/,
read/, kernels/), tests/matrix, tests/benchmarks; project-wide checks (docs, imports, packaging,
bad input to both packages) here. tests/gpu and tests/live need a CUDA device (and a real TE).

The helpers beside them fake TE independently of te_compat's table where a test needs an oracle
that does not echo the code under test: standins.py and te_objects.py (classes from the matrix
records, buffers from facts.md), spec_oracle.py (the layout spec written out), fake_te.py (a TE
package for the self-test). Every other test fakes TE through te_compat.testing.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository
TESTS = ROOT / "tests"
