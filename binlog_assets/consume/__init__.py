"""The consumer core and the bounded run: offsets, lanes, handlers, error policy, checkpoints.

`offsets.OffsetTracker` turns out-of-order completions into a safe commit, `lanes.
LaneDispatcher` runs handlers in parallel while keeping each ordering key in order,
`handlers.HandlerRegistry` maps tables to handlers, `errors.ErrorPolicy` says how hard to
retry before dead-lettering, and `run.BoundedRun` drives them from Kafka.
"""
