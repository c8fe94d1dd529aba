"""What each live comparison with TE ran on, so that no comparison can pass on empty buffers.

On sm_90 TE's MXFP8 quantizers write nothing, and ``make_empty`` never writes: TE's buffers hold
whatever the allocation held (shared/te-releases/facts.md). Every live test therefore fills TE's
buffers (padding included) with random bytes through te_compat's snapshots before it compares,
and asserts that the compared logical region holds many distinct values. The evidence is written
to a JSON side file that ``python -m matrix.live_record`` folds into the run's record.

``TE_COMPAT_LIVE_NO_SEED=1`` (matrix.live_record.NO_SEED_ENV) leaves TE's buffers as allocated:
the tests must then fail (their distinct-value assertion), which shows that they cannot pass
vacuously.
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from matrix.live_record import no_seed_run

EVIDENCE_ENV = "TE_COMPAT_LIVE_EVIDENCE"
MIN_DISTINCT = 64  # of 256 byte values; random bytes over >= 1000 positions give about 250
SEEDED = "seeded random"
AS_ALLOCATED = "as allocated (not seeded)"
WRITTEN_BY_TE = "written by TE's quantizer"


def seeding_on() -> bool:
    return not no_seed_run(None, dict(os.environ))


@dataclass
class Evidence:
    """One test's comparisons: which bytes each ran on and how many distinct values they held."""

    nodeid: str
    seed: int
    comparisons: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seeded_buffers: int = 0
    selftest: dict[str, Any] | None = None  # what `te-compat selftest --json` printed, for the record

    def __post_init__(self) -> None:
        self._generators: dict[torch.device, torch.Generator] = {}

    def _generator(self, device: torch.device) -> torch.Generator:
        if device not in self._generators:
            self._generators[device] = torch.Generator(device=device).manual_seed(self.seed)
        return self._generators[device]

    @property
    def label(self) -> str:
        """What TE's buffers hold after :meth:`fill_random_`."""
        return SEEDED if seeding_on() else AS_ALLOCATED

    def fill_random_(self, *buffers: torch.Tensor | None) -> str:
        """Overwrite each whole buffer (padding included) in place with random bytes; returns
        the label of the bytes now there. A no-op under TE_COMPAT_LIVE_NO_SEED=1."""
        if not seeding_on():
            return self.label
        for buf in buffers:
            if buf is None:
                continue
            if not buf.is_contiguous():
                raise AssertionError(f"cannot seed a non-contiguous TE buffer {tuple(buf.shape)} {buf.stride()}")
            raw = buf.view(torch.uint8)  # same memory; any 1-, 2- or 4-byte dtype
            gen = self._generator(raw.device)
            raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, device=raw.device, generator=gen))
            self.seeded_buffers += 1
        return self.label

    def compared(self, what: str, region: torch.Tensor, source: str) -> None:
        """Record a comparison's logical region, then require many distinct byte values in it."""
        distinct = int(torch.unique(region.reshape(-1).view(torch.uint8)).numel())
        self.comparisons.append({"what": what, "bytes": source, "distinct": distinct, "elements": region.numel()})
        assert distinct >= MIN_DISTINCT, (
            f"{what}: the compared region ({region.numel()} bytes, {source}) holds only {distinct} distinct "
            f"values (< {MIN_DISTINCT}); a comparison with TE on such bytes could pass on empty buffers"
        )

    def note(self, text: str) -> None:
        self.notes.append(text)

    def as_json(self) -> dict[str, Any]:
        found = {
            "seed": self.seed,
            "seeded_buffers": self.seeded_buffers,
            "comparisons": self.comparisons,
            "notes": self.notes,
        }
        return found if self.selftest is None else {**found, "selftest": self.selftest}


def seed_for(nodeid: str) -> int:
    """A reproducible seed per test (the same bytes on every run of that test)."""
    return zlib.crc32(nodeid.encode())


def evidence_path(junitxml: str | None) -> Path | None:
    """Where the side file goes: $TE_COMPAT_LIVE_EVIDENCE, else beside the junit XML."""
    explicit = os.environ.get(EVIDENCE_ENV)
    if explicit:
        return Path(explicit)
    if junitxml:
        return Path(junitxml).with_suffix(".evidence.json")
    return None


def write_evidence(path: Path, tests: dict[str, Evidence]) -> None:
    _write(path, {nodeid: ev.as_json() for nodeid, ev in tests.items()})


def _write(path: Path, tests: dict[str, Any]) -> None:
    payload = {"seeding": seeding_on(), "min_distinct": MIN_DISTINCT, "tests": dict(sorted(tests.items()))}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")


def worker_path(path: Path, worker: str) -> Path:
    """Where pytest-xdist worker ``worker`` (e.g. "gw0") writes its part of ``path``."""
    return path.with_name(f"{path.name}.{worker}")


def merge_worker_evidence(path: Path) -> None:
    """The parts pytest-xdist workers wrote (:func:`worker_path`) as one side file at ``path``; the
    parts are removed. A test is in at most one part: a second sighting is an error."""
    tests: dict[str, Any] = {}
    parts = sorted(path.parent.glob(f"{path.name}.gw*"))
    for part in parts:
        found = json.loads(part.read_text())
        if found.get("seeding") != seeding_on() or found.get("min_distinct") != MIN_DISTINCT:
            raise ValueError(f"{part}: expected seeding {seeding_on()}, min_distinct {MIN_DISTINCT}; found {found}")
        twice = tests.keys() & found["tests"].keys()
        if twice:
            raise ValueError(f"{part}: expected each test in one worker's part; found {sorted(twice)[:3]} twice")
        tests.update(found["tests"])
    _write(path, tests)
    for part in parts:
        part.unlink()
