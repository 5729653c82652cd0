"""Redriving dead letters: ``ringmaster redrive`` reads the dead-letter topic and sends the
records back, to their source topic or through the plugin.

    dead-letter topic ──(own group: <group_id>.redrive)──▶ engine: judge each letter
        │ ends measured at start (fetch high watermark)     │  (selection: --from/--to, --error-type,
        │                                                   │   --max-redrives, forms, source topic)
        │                                                   ▼
        │                      token bucket (--rate) ──▶ action
        │                                 to-source:      produce the original to its source
        │                                                 topic and partition (+ redrive count)
        │                                 through-plugin: plugin.process in this process → outputs
        │                                                 to [output], failures back to the
        │                                                 dead-letter topic (count kept)
        │                                                   │ broker acknowledgements
        └──────────── commit (ledger: the acknowledged prefix per partition) ◀┘

    letters.py   reading a dead letter back; the headers of the record a redrive sends
    selection.py what is redriven, what is passed over and why (--from/--to, --error-type, ...)
    pacing.py    the token bucket behind --rate
    ledger.py    per-partition progress: the offset that may be committed
    report.py    the summary: one line, the dry-run tables, JSON
    actions.py   the side effects: to the source, through the plugin, or counting (dry run)
    engine.py    the loop: consume, judge, act, commit; signals; the end
    command.py   wiring from Settings (what ``ringmaster redrive`` calls)

Runs in: the CLI (``ringmaster redrive``), one thread; the plugin too, in this process, with
``--through-plugin``. May import: runtime.execution (the plugin's run, the dead-letter format),
runtime.ops (logging), runtime.kafka, runtime.plugin, runtime.config, runtime.errors; never the
worker's process or the supervisor.
"""
