"""The directory layout the three commands share (a local path or a mounted volume)."""

import dataclasses
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Lake:
    root: Path

    @property
    def raw(self) -> Path:
        """Raw records, one row per stream entry (Spark's file sink, ``_spark_metadata`` inside)."""
        return self.root / 'raw'

    @property
    def checkpoint(self) -> Path:
        """The ingest's streaming checkpoint: offsets and commits per micro-batch."""
        return self.root / 'checkpoints' / 'raw'

    @property
    def analysis(self) -> Path:
        """The latest analysis: one Parquet table per indicator and the summary."""
        return self.root / 'analysis'

    @property
    def summary(self) -> Path:
        return self.analysis / 'summary.json'
