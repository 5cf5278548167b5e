"""
Shoal's analytics: a Spark job over the metric records the brokers append to ``shoal:metrics``.

``ingest`` lands the stream as raw Parquet exactly once (a Python streaming data source whose
offsets are stream ids), ``analyze`` computes per queue/subscription and per replica indicators,
anomalies and a replica recommendation (Parquet + the summary hash the operator reads), ``report``
renders a self-contained HTML page. The only package of the repository that imports pyspark.
"""
