"""Errors a user of ``shoal-analytics`` can act on; pure, so the CLI imports them without Spark."""


class AnalyticsError(RuntimeError):
    """One line saying what is wrong and what to do."""


class IngestError(AnalyticsError):
    """The ingest stopped (data loss, Redis unreachable, ...)."""


class AnalysisError(AnalyticsError):
    """Nothing to analyse yet."""


class ReportError(AnalyticsError):
    """No analysis to report on."""
