"""``ringmaster console``: a web console for one or more groups, in a process of its own (it never
shares a supervisor's GIL). It reads what the members publish and writes what the CLI writes:

    members (every host) ─status records─▶ _ringmaster.status.<group> ─┐
    dead-letter topic ─────────────────────────────────────────────────┼─▶ followers.py ─▶ state.py
    control topic (pauses, commands, read_to of each member) ──────────┘    (threads)      (memory)
                                                                                            │
    browser ◀── app.py (Starlette under uvicorn): pages, plots (charts.py, server-side SVG) ◀┘
            ──▶ POST (token, CSRF) ─▶ actions.py ─▶ control topic (pause, resume, reload, scale)
                                                 └▶ runtime.redrive (plan = --dry-run, then redrive)

    state.py      what the console knows of a group: members, their history, letters, its actions
    followers.py  the threads that read the three topics into it
    charts.py     line and bar charts as SVG, made on the server (no script, no CDN)
    plots.py      the plots' series, from the members' status records and the dead letters
    preview.py    a record's bytes as an operator reads them: text, JSON or hex, never HTML
    actions.py    the operator's actions, written as the CLI writes them; redrives of a pick
    security.py   who may see and act: loopback by default, a token or basic auth, CSRF
    app.py        the pages and the form posts
    server.py     the console's process: a GroupState and its followers per config, uvicorn

Nothing from a record is rendered as HTML: templates escape everything (Jinja2's autoescape),
and so does every label of a chart. Every asset is in the package (``static/``): no network at
run time but the Kafka cluster. Needs the ``[console]`` extra (Starlette, uvicorn, Jinja2); the
daemon needs none of it.

May import: runtime.redrive (the engine), runtime.ops, runtime.kafka, runtime.config,
runtime.errors; never runtime.supervisor or runtime.worker (import-linter).
"""
