"""The web console: a read-only view of the control plane in a browser, served on 127.0.0.1.

``raylane console`` (or ``raylane up``, in the background) serves it; ``app`` holds the ASGI app and the logins,
``views`` what each page shows, ``server`` how it runs. Pages: the queue (positions, reasons, waits), teams (use
against nominal quota, borrowing limit and budget), nodes (every GPU, its lease's team, cordoned, draining,
quarantined and lost nodes marked), a workload (its journal and MLflow runs) and cost; each updates live.
"""
