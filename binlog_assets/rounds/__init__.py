"""A consume round: partitions planned, run (in worker processes for a large backlog)
and committed together; no Dagster here."""
