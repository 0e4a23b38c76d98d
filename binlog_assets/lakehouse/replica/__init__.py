"""The silver replicas: `builder.ReplicaBuilder` applies the changelog to each replica.

`plan` plans an apply, `routes` says which source tables feed which replica, `rows` and
`driver` shape a batch (in Spark, or in the driver), `commit` and `rewrite` write it,
`ddl_apply` and `cutover` carry out renames, drops and table swaps.
"""
