"""The path of one probe: what runs next (chain), how each kind runs (kinds), one result from
which everything stored, counted, logged and paged on is derived (result), and a thin runner.
"""
