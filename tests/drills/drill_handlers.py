"""Per-table handlers the drill runs load (`drill_handlers:registry`): they do nothing
but make each event go through the lanes, so a kill can land with handlers in flight."""

from binlog_assets.consume.handlers import HandlerRegistry

registry = HandlerRegistry()
registry.register(r".*", lambda event: None, name="drill-noop")
