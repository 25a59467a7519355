"""The one error type of the exporter."""


class ExportError(ValueError):
    """The source or the options cannot produce a valid export."""
