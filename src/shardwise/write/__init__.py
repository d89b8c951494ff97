"""The write: what every front end asks once (``intent.py``: what is at the target for a mode
and a resume, the job, the one create, the one ``ArrayWrite`` builder), ``write_array``'s steps
before the first byte (``target.py``), a new array's metadata (``create.py``), and the one
pipeline that runs every front end's arrays (``pipeline.py``, one ``session.py`` per array:
leases, markers, clear, metadata, the graph, the finish)."""
