"""Data parallelism: N engine replicas (processes) behind one API server.

    api server process                                   replica processes
    AsyncEngine(DPEngine) --add/abort--> router --pipe--> replica 0: LLMEngine step loop
                          <--outputs (deltas), stats---   replica 1: ...

router.py picks a replica per request (least loaded, prefix-cache affinity); replica.py is
a replica's loop; client.py is the front that AsyncEngine steps like an LLMEngine.
"""
