"""`kvcert simulate`: cli.py (arguments, report), model.py (the replay), traces.py (workloads)."""
