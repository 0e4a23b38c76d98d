"""The silver replicas: `builder.ReplicaBuilder` applies the changelog to each replica.

`plan` plans an apply, `routes` says which source tables feed which replica, `rows` and
`arrow_apply` shape a batch (in Spark, or as Arrow without Spark), `arrow_commit` and
`rewrite` write it, `ddl_apply` and `cutover` carry out renames, drops and table swaps.
"""
