"""
The error of a resource that cannot be acted on as written, in a leaf module so that the parsers
of a spec's sections (``models.py``, ``last_value.py``) share it without importing each other.
"""


class InvalidSpec(ValueError):
    """The resource cannot be acted on as written; retrying will not help."""
