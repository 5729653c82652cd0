"""Operations: what an operator sees and uses around a running daemon.

    admin_server.py  /metrics, /healthz, /readyz, /status
    metrics.py       Prometheus families over the status snapshot
    status.py        the typed status snapshot and the status file; why a partition is paused,
                     why a worker was replaced (the enums metrics label by)
    views.py         ``ringmaster status`` / ``top``: reading and rendering a snapshot
    progress.py      the live progress display and the end-of-run summary
    control.py       operator pauses: the group's control topic, read and written
    control_records.py  what a valid control record is, read strictly at the edge (pure)
    member_status.py  each member's status record on the group's status topic, for the console
    topic_commands.py  the operator's requests from the control socket and the control topic, as one
    cluster.py       waiting for the Kafka cluster at start (the daemon waits, commands give up)
    control_socket.py  `ringmaster reload` / `scale`: the daemon's Unix socket, and its client
    member_slot.py   this daemon's slot among its group's daemons on the host (its transactional ids)
    systemd.py       sd_notify
    backstop.py      a thread of C that ends the process when Python cannot (a client holding the GIL)
    keys.py          single keys read from the terminal (``top``'s q)
    logs.py          structured stdlib logging; the throttle for lines that repeat in storms

Runs in: the supervisor (status, metrics, admin server thread, control reader, waiting for
the cluster), the CLI (views, control writer), workers (logs). May import: runtime.kafka, runtime.transport,
runtime.config, runtime.errors; never the supervisor or the worker.
"""
