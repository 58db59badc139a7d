"""Analysis: PySpark jobs over gossip traces and the convergence report. The only package that imports pyspark."""
