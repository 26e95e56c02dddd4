"""The hostile-load probe's parts (`bench/hostile_load.py` runs them):

    wire.py     raw HTTP/2 connections (hyperframe frames, hpack blocks) and raw HTTP/1.1 clients
    targets.py  the servers under attack (huggy serve, a stock grpcio server, the Unity link's
                server), their processes' memory and CPU from /proc, leftovers
    probes.py   the normal clients whose latency is measured, in a process of their own
    attacks.py  the attacks, one function each, and what each row expects
    report.py   verdicts, the markdown table and the JSON document
"""
