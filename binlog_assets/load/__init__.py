"""The initial load: a source table's rows brought in by binlake itself, chunk by chunk
of its primary key, read in parallel without locks while the stream goes on, each chunk
counting at the binlog position of its own consistent snapshot (`loader.py` has the rule).
"""
