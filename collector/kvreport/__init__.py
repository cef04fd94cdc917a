"""kvreport: explain KV-cache and runtime-buffer allocation failures of LLM inference engines.

The package is the client and the analysis core (no Flask, no database). Data flows one way::

    probes + log + argv + env -> Bundle (facts, redacted)  -> analyze() -> Diagnosis

See ``kvreport.bundle`` for the bundle schema and ``kvreport.analyze`` for the diagnosis.
"""

__version__ = "0.1.0"
